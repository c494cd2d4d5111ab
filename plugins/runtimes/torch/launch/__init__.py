"""Starting the workers: :mod:`.launcher` (torch's elastic launch or torchrun; clean stops), and
:mod:`.emulated_device` (emulated device speeds on one host, a test aid).
"""
