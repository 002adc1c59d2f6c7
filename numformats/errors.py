"""The user-input error the workbench and its kernels raise (re-exported by ``workbench.errors``)."""


class InputError(ValueError):
    """Bad user input (prompt token past the vocab, unknown option value, wrong shape...)."""
