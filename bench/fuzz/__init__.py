"""Random training steps through every registered rule.

    python -m bench.fuzz --cases N [--seed S] [--moves K]     N cases, seeds S .. S+N-1
    python -m bench.fuzz --shrink N [--seed S]                hypothesis draws up to N cases
                                                              and shrinks the first failing one
    python -m bench.fuzz --generated [--cases-per-rule N]     every generated substitution the
        [--seed S] [--units U] [--jobs J]                     search uses, in N cases each

blocks.py is the vocabulary of real layers (embeddings, linear, convolutions, every kind of
norm, attention through SDPA and by hand, dropout, views, slices, concatenations, in-place
ops, residuals); user_code.py wraps blocks in what users' code adds around a layer
(torch.utils.checkpoint with dropout in both modes, forward and gradient hooks, closed-over
tensors, tensors made on the fly). models.py draws a small training step from it: random shapes, losses,
dtypes (float64, float32, bf16 autocast) and optimizers, either a recipe or the user's own
loop (loop.py: torch.optim in param groups, a frozen stem, a parameter left out of the
optimizer, clipping, an LR schedule). A seed reproduces a case exactly; under hypothesis
(st.randoms()) every choice shrinks. harness.py captures the case, walks K random moves of
the search (peakcut.optimizer.children: every rule of peakcut.rules.RULES, fission at
random n, re-ordering, undo), generates the program and runs it next to eager for 3 steps
(loss, gradients, parameters, buffers, optimizer state; tolerance from dtype and the
longest reduction), then compares its measured peak with the simulated one. __main__
prints the table of rule x outcome.

--generated: generated_model.py builds a training step of units, each one generated
substitution's source graph at random sizes over parameters, batch tensors and activations;
generated.py captures it, applies every site of the search's own GeneratedRule and runs the
program next to eager for 3 steps, one comparer per unit (loop.py's); generated_main.py
deals the rules into such cases until each has been applied in N of them, and prints the
table rule x cases, ok, not ok, largest difference / allowed, and the rules short of N with
why.
"""
