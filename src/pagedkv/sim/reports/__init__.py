"""What a simulation reports: ``metrics`` accumulates the per-step counters into a
``SimResult`` (hit rates, preemptions, usage, manager time); ``bound`` computes the
clairvoyant bound of a cache of the same size from the run's access log; ``plot`` draws a
sweep (matplotlib, imported only there) and ``frames`` turns results into pandas
DataFrames (pandas, imported only there)."""
