wrap_module = None
