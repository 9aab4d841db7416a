"""Run with `python3 -m unittest` in this folder: no host or broker needed."""

import unittest

from steps import ConfigError, Steps


class StepsTest(unittest.TestCase):

    def test_a_delay_rounds_up_to_the_next_step_and_beyond_the_last_is_refused(self):
        steps = Steps({"steps": ["1s", "10s"]})
        self.assertEqual(steps.step_for(2_500), 10_000)
        self.assertEqual(steps.step_name(10_000), "{{name}}.10000ms")
        self.assertIsNone(steps.step_for(10_001))
        with self.assertRaises(ConfigError):
            Steps({"stepz": ["1s"]})


if __name__ == "__main__":
    unittest.main()
