"""The training floor: workloads, the step model, planning, ZeRO-3, resilience, scaling fits and
straggler studies, built on the what-if facade, the cost models and the engine."""
