"""The exception a plugin's fault raises: a trap, its fuel or memory spent, its deadline, an
output the contract refuses (a NaN learning rate, a batch of 0), a codec's own error."""


class PluginFault(RuntimeError):
    """A fault of one plugin in one call, naming the plugin file, the call and the step.

    ``str()`` is the message the host prints for the same fault: what the guest said (a Python
    exception, a Rust panic), then the wasm trap and its frames.
    """

    def __init__(self, plugin, call, step, message):
        super().__init__(message)
        #: The plugin file, as given.
        self.plugin = plugin
        #: The WIT function that failed, e.g. ``learning-rate`` or ``encode``.
        self.call = call
        #: The training step of the call, or None outside any step.
        self.step = step
        #: The whole message.
        self.message = message

    def __reduce__(self):
        # Picklable, so that a fault on one rank can travel to the others.
        return (type(self), (self.plugin, self.call, self.step, self.message))
