"""The K2 model in torch (started: its INT4 helpers, ``int4``)."""
