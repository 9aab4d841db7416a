/// Server confirmation that the channel has been opened and is ready for use.
