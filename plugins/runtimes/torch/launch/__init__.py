"""Starting the workers: :mod:`.settings` (:class:`~.settings.LaunchSettings`: backend, timeout,
progress bar, start method, the fault testing aid), :mod:`.launcher` (torch's elastic launch or
torchrun; clean stops), and :mod:`.emulated_device` (emulated device speeds on one host, a test aid).
"""
