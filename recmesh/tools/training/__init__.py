"""`recmesh train`: point-in-time training rows -> a CTR model in ONNX plus its card."""
