/// Server-initiated connection handshake, advertising supported AMQP versions and security mechanisms.
