"""The inference service: scores feature rows with the served ONNX model.

`model` loads a model version (ONNX Runtime session + model card) and follows
the model directory's CURRENT pointer; `server` is the gRPC InferenceService.
"""
