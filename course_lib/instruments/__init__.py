"""The ground floor of measuring: the one clock (`timing`: sync, warm-up, repeats, median) and the
peak-memory counters (`peak_memory`). Data, engine, deploy and measure all read them; they import
nothing of the project but the leaves (`devices`)."""
