"""Random training steps through every registered rule (issue 19).

    python -m bench.fuzz --cases N [--seed S] [--moves K]

models.py makes a random small training step from a vocabulary of real layers (embeddings,
linear, convolutions, every kind of norm, attention through SDPA and by hand, dropout,
views, slices, concatenations, in-place ops, residuals), random shapes, losses and
optimizers; a seed reproduces a case exactly. harness.py captures it, walks K random moves
of the search (peakcut.optimizer.children: every rule of peakcut.rules.RULES, fission at
random n, re-ordering, undo), generates the program and runs it next to eager for 3 steps
(loss, gradients, parameters, buffers, optimizer state; tolerance from dtype and the
longest reduction). __main__ prints the table of rule x outcome.
"""
