"""The built-in decoding methods: one module each, named by `configs/method/<name>.yaml`'s `impl`."""
