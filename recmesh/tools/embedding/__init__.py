"""The sentence encoder's offline side: `export` builds the ONNX graph from the
packaged weights, `items` embeds a catalog's item texts, `alignment` measures
next-click MRR. What the services run (weights, encoder) is recmesh/embedding/."""
