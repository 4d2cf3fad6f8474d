"""The two error types every layer raises."""


class ArgumentError(ValueError):
    """An argument breaks one of an op's rules; the message names the argument and the rule."""


class DeviceError(RuntimeError):
    """A device launch of a named op failed with its own status."""


class CompileError(DeviceError):
    """A kernel source did not compile (the message carries the compiler's log)."""


class Declined(NotImplementedError):
    """An implementation does not handle this case (a kernel's documented limit): the case is
    counted as declined, never as passed or failed."""


class OutOfBoundsWrite(RuntimeError):
    """A call wrote outside a tensor it was given (into the poisoned guard margins around it)."""
