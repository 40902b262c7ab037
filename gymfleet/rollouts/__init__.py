"""Working with rollouts: collecting them, preparing datasets, re-verifying, NeMo-RL's RolloutCollectionHelper."""
