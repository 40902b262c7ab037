"""One module per instruction family (the id prefix before the colon); `registry.py` maps ids to checkers."""
