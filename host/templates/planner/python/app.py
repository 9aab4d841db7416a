"""{{name}}: an hourglass delay planner in Python (the strategy is in steps.py).

componentize-py turns this module into a component of the `planner-world` in
wit/; `./build` does it. WIT records are classes, variants are one class per
case, and raising `Err` returns a result's error.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types as t

from steps import ConfigError, Steps


class Configured:
    """The strategy `configure` built. Module state: componentize-py makes a
    new Planner object for each call into the component. `names` are the
    exchanges plans publish to, registered once (the host asks for them right
    after `configure`): the default exchange at index 0, then each step's; a
    plan names one by index, not by string."""

    steps = None
    names = []


class Planner(exports.Planner):

    def describe(self):
        keys = [
            t.ConfigKey("prefix", "names of the step exchanges and queues: <prefix>.<ms>ms", "{{name}}"),
            t.ConfigKey("steps", "the delays it delivers; others round up to the next", '["1s", "10s", "1m"]'),
        ]
        return t.PlannerInfo("{{name}}", "0.1.0", t.BrokerFamily.AMQP, keys)

    def configure(self, config_json):
        try:
            Configured.steps = Steps(json.loads(config_json))
        except ConfigError as error:
            raise Err(str(error))
        Configured.names = [""] + [Configured.steps.step_name(ms) for ms in Configured.steps.steps]
        return t.DelayRange(t.Granularity_Listed([0] + Configured.steps.steps), Configured.steps.steps[-1])

    def names(self):
        return Configured.names

    def topology(self):
        commands = []
        for ms in Configured.steps.steps:
            name = Configured.steps.step_name(ms)
            ttl = [t.Field("x-message-ttl", t.Value_Int(ms)), t.Field("x-dead-letter-exchange", t.Value_Text(""))]
            commands.append(t.Command_DeclareExchange(t.DeclareExchange(name, t.ExchangeKind.FANOUT, True, [])))
            commands.append(t.Command_DeclareQueue(t.DeclareQueue(name, True, ttl)))
            commands.append(t.Command_BindQueue(t.BindQueue(name, name, "", [])))
        return commands

    def destination_setup(self, destination):
        return []

    def plan(self, request):
        step = Configured.steps.step_for(request.delay_ms)
        if step is None:
            raise Err(f"delay {request.delay_ms}ms is above the longest step {Configured.steps.steps[-1]}ms")
        # A name is registered (an index into `names`) or text: the destination is this request's own.
        exchange = t.Name_Registered(Configured.steps.steps.index(step) + 1 if step else 0)
        return t.DelayPlan([t.Command_Publish(t.Publish(exchange, t.Name_Text(request.destination), [], [], None, True))], step)

    def handle_due(self, message):
        raise Err("{{name}} is not pump-driven")

    def handle_held(self, message):
        raise Err("{{name}} holds no messages in a stream")

    def decide_redelivery(self, request):
        raise Err("{{name}} does not decide redeliveries")
