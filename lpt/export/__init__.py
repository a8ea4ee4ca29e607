"""Writing lpt's graphs back as standard ONNX."""
