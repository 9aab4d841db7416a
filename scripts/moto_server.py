"""Runs moto's server (the local SQS server of the tests and benches) with two
fixes to its SQS model.

Speed: its SQS models read the clock through a datetime round trip, once per
message in the queue on every send (a FIFO send reads the queue's attributes,
which count visible, delayed and in-flight messages), so a queue of a thousand
messages took half a second a SendMessageBatch. Reading the clock with
time.time() gives the same value and makes that scan cheap.

Long polls: moto's ReceiveMessage with WaitTimeSeconds scans the queue, then
waits on the queue's condition until it has any visible message. A queue whose
visible messages all sit behind an in-flight FIFO group has such messages
already, so the wait returns at once and the poll re-scans in a busy loop for
its whole wait, holding the GIL: one such poll took 64 % of a core and made
every other request to the server slower (a 5 ms request up to 550 ms). It
also kept the FIFO groups in flight as they were when it began, so a group
freed by a delete during the wait stayed hidden until the wait ended. Here a
long poll scans with moto's own receive without a wait (one pass, FIFO groups
in flight as they are now), returns what it found, and otherwise sleeps on the
queue's condition, which a send notifies, for at most RESCAN_SECONDS while the
queue holds messages that could become receivable without a send, or for the
rest of its wait if the queue is empty. A poll whose client has closed its
connection (a killed host, a client that gave up) ends there without taking
anything: it went on waiting, and the first send woke it before the live
polls, so it took the message and hid it for the queue's visibility timeout
(on a FIFO queue seven times in eight; moto's own loop, three in eight). Used
by scripts/brokers.sh; arguments are moto_server's."""

import select
import socket
import time

import flask
from moto.core import utils
from moto.sqs import models
from moto.server import main

# How soon a waiting poll sees a message become receivable without a send
# (a delay or visibility timeout ending, its FIFO group's in-flight message
# deleted): once a second, as moto's own loop did. With 50 ms the tests'
# receives gathered fewer messages each, and sqs_pumps' cost test spent
# 27-33 requests against a model of 20 (bound 30), where it spends 21 now.
RESCAN_SECONDS = 1.0


def unix_time(dt=None):
    return time.time() if dt is None else utils.unix_time(dt)


def unix_time_millis(dt=None):
    return time.time() * 1000.0 if dt is None else utils.unix_time_millis(dt)


scan_once = models.SQSBackend.receive_message


def client_gone():
    """Whether the client of the request served here closed its connection."""
    if not flask.has_request_context():
        return False
    sock = flask.request.environ.get("werkzeug.socket")
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        # Readable with nothing to read: the client's end is closed.
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def receive_message(self, queue_name, count, wait_seconds_timeout, visibility_timeout, message_attribute_names=None):
    deadline = time.monotonic() + wait_seconds_timeout
    while True:
        found = scan_once(self, queue_name, count, 0, visibility_timeout, message_attribute_names)
        left = deadline - time.monotonic()
        if found or left <= 0:
            return found
        queue = self.get_queue(queue_name)
        with queue._messages_lock:
            # Checked under the lock a send appends under: an empty queue
            # can only change by a send, which wakes this wait.
            queue._messages_lock.wait(min(left, RESCAN_SECONDS) if queue._messages else left)
        if client_gone():
            return []


models.unix_time = unix_time
models.unix_time_millis = unix_time_millis
models.SQSBackend.receive_message = receive_message

if __name__ == "__main__":
    main()
