/// Server notification that a previously blocked connection has been unblocked and publishing may resume.
