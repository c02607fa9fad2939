"""The policy simulator: workloads replayed on a virtual clock.

Plain Python, no Django, like `queueapp.policy`, whose functions it calls to
decide (`rank`, `counterfactual_winners`): what it measures is the code that
runs. `traces` reads workloads (`traces.generators` writes them), `engine`
replays one through a policy, `baselines` holds the policies compared,
`cluster` and `cluster_policies` do the same on several GPUs (`fleet` reads
their names, reservations and parallel slots), `metrics` turns a run into
figures, `sweep` tries several settings, `parallel` compares slots with one
job at a time (`slot_metrics` holds what it measured) and `report` writes
the tables and plots.
"""
