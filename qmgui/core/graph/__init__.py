"""Graph pieces the architecture families share (llama.cpp's src/llama-graph.cpp): dimensions
(dims.py), the builder (builder.py) and one module per block kind."""
