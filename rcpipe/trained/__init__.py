"""A trained model as a file: model.pt, a package directory, its ONNX graph."""
