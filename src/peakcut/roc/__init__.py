"""ROC's partitioner and memory manager, for graph neural network steps (docs/gnn.md).

    feats = edge_features(dst, src, num_vertices)              # per edge, prefix-summed
    model = fit_part_model(part_features, measured_seconds)    # per layer, non-negative
    split = balanced_split(feats, model.costs(feats.vertex_features()), n)   # vertex ranges

- features.py: the cost model's features of an edge list grouped by destination, per edge
  and per destination vertex, prefix-summed (vertices, neighbours, runs of consecutive
  neighbours, memory lines touched);
- model.py: the per-layer linear model of a part's time (plus a per-part and a first-part
  term), fitted by non-negative least squares on measured part times;
- partition.py: split points by prefix sums and binary search (vertex ranges as ROC's, or
  edge ranges), and the equal-vertex and equal-edge splits to compare with;
- memory_manager.py: ROC's memory manager, a dynamic program over execution states and cached
  tensors, as an oracle for the search's swaps.
"""
