"""Task shapes: what a model predicts per example, and how the data, the model, the evaluation and the outputs
treat it. base.py (TaskShape: the questions every part asks a shape), single_label.py, multi_label.py,
regression.py (one shape each), registry.py (the shapes, one row each), label_values.py (labels written as
text, class ids), scores.py (the metrics by name; evaluate_modules/ holds the `evaluate` modules shipped for
offline use, which call them)."""
