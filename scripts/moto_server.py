"""Runs moto's server (the local SQS server of the tests and benches) with one
fix for speed: its SQS models read the clock through a datetime round trip,
once per message in the queue on every send (a FIFO send reads the queue's
attributes, which count visible, delayed and in-flight messages), so a queue
of a thousand messages took half a second a SendMessageBatch. Reading the
clock with time.time() gives the same value and makes that scan cheap. Used
by scripts/brokers.sh; arguments are moto_server's."""

import time

from moto.core import utils
from moto.sqs import models
from moto.server import main


def unix_time(dt=None):
    return time.time() if dt is None else utils.unix_time(dt)


def unix_time_millis(dt=None):
    return time.time() * 1000.0 if dt is None else utils.unix_time_millis(dt)


models.unix_time = unix_time
models.unix_time_millis = unix_time_millis

if __name__ == "__main__":
    main()
