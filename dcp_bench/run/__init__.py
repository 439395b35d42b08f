"""The one run path: a composed config becomes a `RunSpec` (`spec`), its parts are built once
(`assemble`), and one step loop (`loop`) drives either executor: the simulator (`simulated`) or
real training under torchrun (`torch_run`)."""
