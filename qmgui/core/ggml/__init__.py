"""The ggml layer of the sizing core: tensors (tensor.py), ggml's constructors and graph
order (graph.py), the ggml-alloc port (alloc.py) and its walk compiled per graph structure
(compile.py)."""
