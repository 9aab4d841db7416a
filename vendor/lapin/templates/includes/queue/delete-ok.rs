/// Server confirmation of `queue.delete`, returning the number of messages that were in the queue.
