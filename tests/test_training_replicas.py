"""Published runs whose replicas are smaller than a server are built with as many
replicas together as fill one (simulator.validate.training.generator_options): the
workload the replay would otherwise build again once it found a replica splitting a
server."""

from simulator.validate.training import generator_options, load_runs, run_topology
from simulator.workload import run_workload
from simulator.workload.generators import megatron


def test_tp4_run_is_built_two_replicas_at_once_with_the_same_step():
    """TP 4 on 8-GPU H100 servers: two replicas fill a server. Built so, the step is the
    one the replay reaches from one replica (it finds the split and builds two), to the
    last bit, with the same replicas simulated and the same ops replayed."""
    run = next(r for r in load_runs()[0] if r.id == "dgxc-v25.01-nemotron4-15b-h100-bf16-16")
    assert (run.tp, run.cp, run.dp, run.gpu) == (4, 1, 4, "H100")
    options = generator_options(run)
    assert options["replicas"] == 8 // (run.tp * run.cp) == 2
    topology, nodes = run_topology(run)
    at_once, step = run_workload(megatron(**options), topology, nodes=nodes)
    found, reference = run_workload(
        megatron(**{**options, "replicas": True}), topology, nodes=nodes
    )
    assert found.replicas == at_once.replicas == {"count": 4, "simulated": 2}
    assert len(found.workload.ops) == len(at_once.workload.ops)
    assert step.step_s == reference.step_s


def test_runs_filling_a_server_keep_one_replica():
    """TP 8 fills a server: one replica stands for all, as before."""
    run = next(r for r in load_runs()[0] if r.id == "megatron-lm-readme-gpt-314b-h100-bf16-3072")
    assert run.tp == 8 and generator_options(run)["replicas"] is True
