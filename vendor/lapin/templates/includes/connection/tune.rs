/// Server proposal for connection parameters: maximum channel count, maximum frame size, and heartbeat interval.
