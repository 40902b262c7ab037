"""Running a fleet: config loading and merging, the supervisor, the zygote, launching servers, the head server,
Ray placement, NeMo-RL's RunHelper."""
