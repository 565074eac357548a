"""Training-step numerics: the statistics of gradients, updates and optimizer state under a storage format
(``statistics``), which the reference step, the error model, the probe and a monitor inside a training loop
all compute the same way. Torch only: nothing here reads the IR or the rules."""
