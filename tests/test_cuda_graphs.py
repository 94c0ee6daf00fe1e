"""The CUDA-graph path (oospec.engine.cuda_graphs) on a CPU: everything but the capture itself. The static-buffer
forward is bitwise the padded forward, its inputs are what the padded forward's mask compacts to, a graph is
captured once per capacity bucket (a fake graph API that replays by recomputing), and without CUDA it falls
back to the eager static forward, saying why. Whether capture works on a GPU is tests/gpu_graph_check.py's."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from adversarial import DecoyOracleDrafter
from helpers import tiny_model

from oospec.engine import padded
from oospec.engine.cuda_graphs import (CAPACITY_STEP, Captured, GraphTargetBackend, StaticInputs, capacity_bucket,
                                       graph_unavailable)
from oospec.engine.decode import generate
from oospec.engine.drafting import Drafter, Request
from oospec.engine.precision import random_tree
from oospec.engine.target import TargetBackend


@pytest.fixture()
def model():
    m = tiny_model("qwen2")
    assert padded.install(m, allow_cpu=True)["applied"]
    return m


class FakeGraphs:
    """Captures by running the forward once and replays by running it again into the same output tensor: what a
    graph does, for a forward that reads only the static inputs."""

    def __init__(self):
        self.captures = self.replays = 0

    def capture(self, forward):
        self.captures += 1
        output = forward()

        def replay():
            self.replays += 1
            output.copy_(forward())

        return Captured(replay, output)


def test_capacity_buckets():
    assert capacity_bucket(1) == CAPACITY_STEP
    assert capacity_bucket(CAPACITY_STEP) == CAPACITY_STEP
    assert capacity_bucket(CAPACITY_STEP + 1) == 2 * CAPACITY_STEP


def test_guard_names_why_graphs_cannot_run():
    m = tiny_model("qwen2")
    assert "padded forward is not installed" in graph_unavailable(m)
    with pytest.raises(ValueError, match="padded forward"):
        GraphTargetBackend(m)
    padded.install(m, allow_cpu=True)
    assert graph_unavailable(m) == "device is cpu: CUDA graphs need cuda"
    backend = GraphTargetBackend(m)
    assert not backend.uses_graphs and backend.graph_reason.startswith("device is cpu")


def test_static_inputs_are_what_the_padded_mask_compacts_to(model):
    rng = np.random.default_rng(1)
    target = TargetBackend(model)
    static = StaticInputs(target.step_rows, 256, torch.device("cpu"), torch.float32)
    for nodes in (0, 1, 5, 16, 63):
        tree = random_tree(rng, nodes, 100) if nodes else random_tree(rng, 1, 100).pruned(0, 0)
        start = int(rng.integers(1, 150))
        static.fill(7, tree, start)
        mask = target._tree_mask(tree, start, target.step_rows)
        slots, lengths = padded.compact_rows(mask, target.step_rows, start + target.step_rows)
        assert torch.equal(static.tree_slots, slots) and torch.equal(static.lengths, lengths)
        assert torch.equal(static.write_slots, torch.arange(start, start + target.step_rows))
        assert int(static.start) == start and static.real_rows == len(tree) + 1
        assert static.ids[0, 0] == 7 and torch.equal(static.ids[0, 1 : len(tree) + 1], torch.from_numpy(tree.tokens))
    with pytest.raises(ValueError, match="does not fit"):
        static.fill(7, tree, 256 - target.step_rows + 1)


def _steps(backend_a, backend_b, vocab, seed=0, steps=6):
    """Both backends through the same prefill and trees, committing the greedy path: logits compared bitwise."""
    from oospec.engine.acceptance import greedy_accept

    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, 80)
    for b in (backend_a, backend_b):
        b.reset(200)
    pending = backend_a.prefill(prompt)
    assert backend_b.prefill(prompt) == pending
    for _ in range(steps):
        tree = random_tree(rng, int(rng.integers(1, 12)), vocab)
        la, lb = backend_a.verify_logits(pending, tree), backend_b.verify_logits(pending, tree)
        assert torch.equal(la, lb)
        path, bonus = greedy_accept(tree, la.argmax(-1).numpy())
        backend_a.commit(path)
        backend_b.commit(path)
        assert backend_a.length == backend_b.length
        pending = bonus


def test_eager_static_forward_is_bitwise_the_padded_forward(model):
    _steps(GraphTargetBackend(model), TargetBackend(model), model.config.vocab_size)


def test_generation_is_identical_through_the_static_forward(model):
    vocab = model.config.vocab_size
    prompt = np.random.default_rng(3).integers(0, vocab, 60)
    request = Request(prompt_ids=prompt, eos_ids=frozenset(), max_new_tokens=24)
    plain = generate(TargetBackend(model), Drafter(), request).tokens
    graph = GraphTargetBackend(model)
    for drafter in (Drafter(), DecoyOracleDrafter(plain, vocab, 2)):  # plain steps; deep trees among decoys
        out = generate(graph, drafter, replace(request, budget=63))
        assert np.array_equal(out.tokens, plain), drafter.name


def test_one_capture_per_capacity_bucket(model):
    fake = FakeGraphs()
    graph = GraphTargetBackend(model, graph_api=fake)
    assert graph.uses_graphs
    _steps(graph, TargetBackend(model), model.config.vocab_size, steps=5)
    assert fake.captures == 1 and fake.replays == 5  # captured at the first verification, replayed at every one
    graph.reset(300)  # the same bucket: the graph and its buffers stay
    assert graph.captured is not None
    graph.reset(CAPACITY_STEP + 10)  # a bigger bucket: new buffers, so a new graph at the next verification
    assert graph.captured is None and graph.static.capacity == 2 * CAPACITY_STEP
    _steps(graph, TargetBackend(model), model.config.vocab_size, seed=1, steps=2)
    assert fake.captures == 2 and graph.captures == 2


def test_hidden_states_and_wide_forwards_take_the_padded_path(model):
    graph = GraphTargetBackend(model, graph_api=FakeGraphs())
    graph.reset(100)
    pending = graph.prefill(np.arange(1, 30))
    tree = random_tree(np.random.default_rng(0), 6, model.config.vocab_size)
    out = graph.verify_outputs(pending, tree, hidden_states=True)
    assert out.hidden_states is not None and graph.captured is None  # not captured: the probe's forward
    plain = TargetBackend(model)
    plain.reset(100)
    plain.prefill(np.arange(1, 30))
    assert torch.equal(out.logits, plain.verify_outputs(pending, tree, hidden_states=True).logits)


def test_an_engine_opts_in_only_where_graphs_can_run(model):
    from oospec.engine.cuda_graphs import enable_graphs
    from oospec.engine.engine import Engine

    engine = Engine(model, tokenizer=None)
    before = engine.target
    assert enable_graphs(engine) == "device is cpu: CUDA graphs need cuda" and engine.target is before
    fake = FakeGraphs()
    assert enable_graphs(engine, graph_api=fake) == "" and isinstance(engine.target, GraphTargetBackend)
    assert engine.target.prefill_chunk == before.prefill_chunk and engine.target.uses_graphs
