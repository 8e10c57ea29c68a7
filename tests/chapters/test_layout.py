"""distlab.parallel3d.planner, the layout calculator: each formula against numbers computed by hand or quoted
from its source, the decision procedure on three textbook situations, and bad input.

Pure Python, no ranks: the whole file runs in about a second. (That the calculator's
*exact* predictions equal what the ranks count is tests/chapters/test_mesh.py's job.)

Checked to fail on purpose: the 16-bit activation formula without the 5as/h attention
term, the bubble as (p-1)/m, the dp link judged by its stride instead of its span, and
recommend keeping the last layout tried instead of the fastest; and for context parallelism,
activations not divided by cp, the ring's backward sending cp-1 blocks instead of 2cp-1, ZeRO
sharding over dp instead of dp*cp, every key/value head on every tp rank, the cp group's span
without tp, and the ring's time counted whole instead of its excess over attention.
"""

from __future__ import annotations

import pytest

from distlab import models
from distlab.parallel3d import planner, predict, recommend
from distlab.parallel3d.mesh import Grid
from distlab.parallel3d.planner import Cluster, Model, Training
from distlab.tools import memory
from distlab.zero import theory

GPT3 = Model(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048, tied=True)
TINY = Model.from_config(models.GPTConfig())
MEGATRON = ("pp", "dp", "tp")


def test_parameter_counts():
    # GPT-3 175B: 96 blocks of 12h^2 + 13h, token and position embeddings, final norm; head tied
    h = 12288
    assert GPT3.params == 96 * (12 * h**2 + 13 * h) + 51200 * h + 2048 * h + 2 * h == 174_615_846_912
    tiny = models.build("gpt")
    assert TINY.params == memory.count_parameters(tiny) == 135_168
    assert TINY.tensors == len(list(tiny.parameters())) == 30


@pytest.mark.parametrize("shape, mlp_ratio, llama3_params", [
    (dict(layers=32, hidden=4096, heads=32), 4.5, 8_030_261_248),      # Llama 3 8B
    (dict(layers=80, hidden=8192, heads=64), 4.375, 70_553_706_496),   # Llama 3 70B
])
def test_llama3_presets_of_chapter_7_have_the_real_parameter_counts(shape, mlp_ratio, llama3_params):
    """The presets chapter 7 calls "8B" and "70B" (grouped-query attention and SwiGLU folded into
    the MLP ratio) count Llama 3's parameters; the only difference is the planner's LayerNorm
    biases, which Llama's RMSNorms lack: two per block and one at the end."""
    model = Model(**shape, vocab=128256, seq=4096, mlp_ratio=mlp_ratio, biases=False, learned_positions=False)
    norm_biases = (2 * shape["layers"] + 1) * shape["hidden"]
    assert model.params - norm_biases == llama3_params


def test_parameters_on_a_rank_split_the_matrices_and_keep_norms_and_row_biases_whole():
    # TinyGPT, tp=2: tok, head (+bias), per block qkv (+bias), proj, fc1 (+bias), fc2 halved;
    # pos, 5 LayerNorms, proj and fc2 biases whole
    sharded = 256 * 64 + (256 * 64 + 256) + 2 * (12 * 64 * 64 + 7 * 64)
    replicated = 32 * 64 + 2 * 64 + 2 * (6 * 64)
    assert TINY.params_on_rank(tp=2) == sharded // 2 + replicated == 69_056
    assert TINY.params_on_rank(tp=1) == TINY.params
    # two stages: the first holds the embeddings, the last the final norm and the head
    block_sharded, block_replicated = 12 * 64 * 64 + 7 * 64, 6 * 64
    assert TINY.params_on_rank(pp=2, stage=0) == block_sharded + block_replicated + 256 * 64 + 32 * 64
    assert TINY.params_on_rank(pp=2, stage=1) == block_sharded + block_replicated + 256 * 64 + 256 + 2 * 64
    # tied embeddings: a pipeline's last stage keeps its own copy of the output matrix
    assert GPT3.params_on_rank(pp=2, stage=0) + GPT3.params_on_rank(pp=2, stage=1) == GPT3.params + 51200 * 12288


def test_model_states_match_the_zero_papers_figure_1():
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, 64 GPUs, mixed precision + Adam
    gb = {z: theory.model_state_theory(7.5e9, 64, z, "mixed")["total"] / 1e9 for z in range(4)}
    assert gb[0] == 120 and gb[3] == 1.875
    assert round(gb[1], 1) == 31.4 and round(gb[2], 1) == 16.6


def test_activations_per_layer_are_korthikantis_table_2():
    sbh = 2048 * 1 * 12288                                    # GPT-3, micro-batch 1
    per = lambda tp, **kw: planner.activation_bytes_per_layer(GPT3, Training(1, **kw), tp)  # noqa: E731
    assert per(1) == sbh * (34 + 5 * 96 * 2048 / 12288) == 114 * sbh
    assert per(8) == sbh * (10 + 24 / 8 + 5 * 96 * 2048 / (12288 * 8)) == 23 * sbh
    assert per(8, sequence_parallel=True) == sbh / 8 * 114
    assert per(8, sequence_parallel=True, recompute="selective") == 34 * sbh / 8
    assert per(8, recompute="selective") == sbh * (10 + 24 / 8)
    assert per(8, recompute="full") == 2 * sbh and per(8, recompute="full", sequence_parallel=True) == 2 * sbh / 8
    assert per(8, precision="fp32") == 2 * per(8)


def test_bubble():
    assert planner.bubble(4, 8) == 3 / 11
    assert planner.bubble(1, 8) == 0
    assert planner.bubble(4, 1) == 3 / 4


def test_links_follow_the_span_of_each_group():
    assert planner.link(Grid(dp=16, tp=8), "tp", 8) == "intra"
    assert planner.link(Grid(dp=16, tp=8), "dp", 8) == "inter"
    assert planner.link(Grid(dp=16, tp=8), "pp", 8) is None
    grid = Grid(dp=2, pp=2, tp=4)                            # 16 GPUs, 8 per node
    assert [planner.link(grid, a, 8) for a in ("tp", "pp", "dp")] == ["intra", "intra", "inter"]
    megatron = Grid(dp=2, pp=2, tp=4, order=MEGATRON)        # dp inside, pp across nodes
    assert [planner.link(megatron, a, 8) for a in ("tp", "dp", "pp")] == ["intra", "intra", "inter"]
    assert planner.link(Grid(dp=2, pp=2, tp=2), "dp", 8) == "intra"          # one node: all intra
    assert planner.link(Grid(dp=3, tp=4), "tp", 6) == "inter"                # ranks 4..7 straddle a node


def test_one_layout_by_hand():
    model = Model(layers=4, hidden=1024, heads=16, vocab=32000, seq=1024)
    cluster = Cluster(gpus=16, gpus_per_node=8, intra_bandwidth=100e9, inter_bandwidth=10e9, flops=1e15, mfu=0.5)
    training = Training(global_batch=32, micro_batch=2)
    e = planner.estimate(model, cluster, training, Grid(dp=2, pp=2, tp=4), zero=1)
    assert e.micro_batches == 32 // (2 * 2) == 8
    sbh = 1024 * 2 * 1024
    # tp: 2 layers per stage x 8 micro-batches x 4 all-reduces of 2 sbh bytes over 4 ranks
    assert e.comm_bytes["tp"] == 2 * 8 * 4 * (2 * 3 / 4 * 2 * sbh)
    # pp: with two stages, each sends one way: 8 micro-batches x 2 sbh bytes
    assert e.comm_bytes["pp"] == 8 * 2 * sbh
    stage0 = (2 * (12 * 1024**2 + 7 * 1024) + 32000 * 1024) // 4 + 2 * 6 * 1024 + 1024 * 1024
    assert stage0 == model.params_on_rank(4, 2, 0) == 15_547_904
    # dp, ZeRO-1: reduce-scatter + all-gather = 2 (d-1)/d x 2-byte gradients, the bigger stage
    assert e.comm_bytes["dp"] == 2 * (1 / 2) * 2 * stage0
    assert e.links == {"tp": "intra", "pp": "intra", "dp": "inter", "cp": None}
    assert e.comm_bytes["cp"] == 0 and e.cp == 1                    # no context parallelism asked for
    # memory of stage 0: 2 + 2 + 12/2 bytes per parameter, activations of 2 layers x 2 micro-batches in flight
    per_layer = sbh * (10 + 24 / 4 + 5 * 16 * 1024 / (1024 * 4))
    assert e.memory["activations"] == 2 * 2 * per_layer
    assert e.memory["total"] == 10 * stage0 + 2 * 2 * per_layer
    assert e.fits
    ideal = 6 * model.params * (32 * 1024) / 16 / (1e15 * 0.5)
    assert e.ideal_seconds == pytest.approx(ideal)
    assert e.compute_seconds == pytest.approx(ideal * (8 + 2 - 1) / 8)
    dp_exposed = max(0.0, e.comm_bytes["dp"] / 10e9 - ideal * 2 / 3)
    assert e.step_seconds == pytest.approx(e.compute_seconds + e.comm_bytes["tp"] / 100e9
                                           + e.comm_bytes["pp"] / 100e9 + dp_exposed)
    zero3 = planner.estimate(model, cluster, training, Grid(dp=2, pp=2, tp=4), zero=3)
    assert zero3.comm_bytes["dp"] == 1.5 * e.comm_bytes["dp"]
    assert zero3.memory["parameters"] == e.memory["parameters"] / 2


def test_rank_layouts_lists_every_runnable_layout_fitting_and_fastest_first():
    cluster, training = Cluster(gpus=64), Training(global_batch=512, micro_batch=2)
    model = Model(layers=32, hidden=4096, heads=32, vocab=50304, seq=2048)
    ranked = recommend.rank_layouts(model, cluster, training)
    assert {(e.grid.tp, e.grid.pp) for e in ranked} == {(t, p) for t in (1, 2, 4, 8, 16, 32, 64) if 32 % t == 0
                                                         for p in (1, 2, 4, 8, 16, 32, 64) if 32 % p == 0 and t * p <= 64}
    fits = [e.fits for e in ranked]
    assert fits == sorted(fits, reverse=True) and fits[0]
    times = [e.step_seconds for e in ranked if e.fits]
    assert times == sorted(times)
    first = ranked[0]
    again = planner.estimate(model, cluster, training, first.grid, first.zero)
    assert (again.step_seconds, again.memory) == (first.step_seconds, first.memory)


def test_recommend_small_model_data_parallel():
    model = Model(layers=32, hidden=4096, heads=32, vocab=50304, seq=2048)
    advice = recommend.recommend(model, Cluster(gpus=64), Training(global_batch=512, micro_batch=2))
    assert (advice.choice.grid, advice.choice.zero) == (Grid(dp=64), 2)     # 7B: ZeRO-2 is the first stage to fit
    assert "ZeRO-2" in str(advice) and not any(line.startswith("2.") for line in advice.steps)


def test_recommend_gpt3_slow_data_parallel_then_tensor_parallel_inside_a_node():
    advice = recommend.recommend(GPT3, Cluster(gpus=256), Training(global_batch=512, recompute="full"))
    assert (advice.choice.grid, advice.choice.zero) == (Grid(dp=64, tp=4), 3)
    assert "dp=256 pp=1 tp=1 ZeRO-3" in advice.steps[2] and advice.steps[2].endswith("too slow")
    advice = recommend.recommend(GPT3, Cluster(gpus=1024), Training(global_batch=1536))
    assert advice.choice.grid == Grid(dp=128, tp=8) and "tp=4: even with ZeRO-3" in str(advice)


def test_recommend_pipeline_when_the_batch_cannot_feed_more_replicas():
    advice = recommend.recommend(GPT3, Cluster(gpus=256), Training(global_batch=16))
    assert advice.choice.grid.tp == 8 and advice.choice.grid.pp > 1
    tried = [line for line in advice.steps if line.startswith("  dp=") and "pp=1 " not in line]
    fastest = min(tried, key=lambda line: float(line.split("step ")[1].split(" s")[0]))
    assert advice.choice.describe() in fastest                              # none good: the fastest seen


def test_recommend_says_when_nothing_fits():
    advice = recommend.recommend(GPT3, Cluster(gpus=32), Training(global_batch=32, recompute="full"))
    assert advice.choice is None and "none fits" in advice.steps[-1]


def test_predict_run_by_hand_for_tinygpt_at_dp2_tp2():
    predicted = predict.predict_run(TINY, Grid(dp=2, tp=2), batch_size=8)
    assert predicted["bytes"] == {"parameters": 4 * 69_056, "gradients": 4 * 69_056, "optimizer": 0,
                                  "total": 8 * 69_056}
    activations = 4 * (8 // 2) * 32 * 64                      # float32 (b, s, h) of one dp shard
    assert predicted["sent"] == {"tp": (4 * 2 + 2) * activations + 3 * 4 * 4 * 32, "pp": 0, "dp": 4 * 69_056}
    adam = predict.predict_run(TINY, Grid(dp=2, tp=2), batch_size=8, optimizer="adamw")
    assert adam["bytes"]["optimizer"] == 8 * 69_056 + 4 * 30
    fsdp = predict.predict_run(TINY, Grid(dp=2, tp=2), batch_size=8, engine="torch")
    root = (256 * 64 + 256 * 64 + 256) // 2 + 32 * 64 + 2 * 64
    assert fsdp["sent"] == {"tp": None, "pp": 0, "dp": 4 * (3 * 69_056 - root) // 2}
    assert fsdp["bytes"]["parameters"] == 4 * 69_056 // 2


def test_predict_run_by_hand_for_a_pipeline_with_tensor_parallel_stages():
    # pp2 x tp2, 8 sequences in 2 micro-batches of 4; float32 (4, 32, 64) activations of 32 KiB
    activation = 4 * 4 * 32 * 64
    first = predict.predict_run(TINY, Grid(pp=2, tp=2), 8, stage=0, micro_batches=2)
    last = predict.predict_run(TINY, Grid(pp=2, tp=2), 8, stage=1, micro_batches=2)
    # per micro-batch: 4 all-reduces in the stage's block, + the embedding's (first) or the head's (last)
    assert first["sent"] == {"tp": 2 * 5 * activation, "pp": 2 * activation, "dp": 0}
    # + the vocab-parallel loss: three all-reduces of (4, 32) floats (2 (n-1)/n = 1 at n = 2);
    # the logits themselves (4 * 4 * 32 * 128 bytes per rank) never travel
    loss = 3 * 4 * 4 * 32
    assert last["sent"] == {"tp": 2 * (5 * activation + loss), "pp": 2 * activation, "dp": 0}
    block = (12 * 64 * 64 + 7 * 64) // 2 + 6 * 64
    assert first["bytes"]["parameters"] == 4 * (block + 256 * 64 // 2 + 32 * 64)
    assert last["bytes"]["parameters"] == 4 * (block + (256 * 64 + 256) // 2 + 2 * 64)
    assert (TINY.tensors_on_rank(2, 0), TINY.tensors_on_rank(2, 1)) == (12 + 2, 12 + 4)


def test_bad_input_raises_value_errors():
    with pytest.raises(ValueError, match="precision"):
        Training(8, precision="fp8")
    with pytest.raises(ValueError, match="recompute"):
        Training(8, recompute="some")
    cluster = Cluster(gpus=8)
    with pytest.raises(ValueError, match="multiply to the world size"):
        planner.estimate(TINY, cluster, Training(8), Grid(dp=4))
    with pytest.raises(ValueError, match=r"tp=8 does not divide the number of heads \(4\)"):
        planner.estimate(TINY, cluster, Training(8), Grid(tp=8))
    with pytest.raises(ValueError, match=r"pp=8 does not divide the number of layers \(2\)"):
        planner.estimate(TINY, cluster, Training(8), Grid(pp=8))
    with pytest.raises(ValueError, match="does not split into dp=8"):
        planner.estimate(TINY, cluster, Training(12), Grid(dp=8))
    with pytest.raises(ValueError, match=r"stage must be 0 \(DDP\), 1, 2 or 3"):
        theory.model_state_theory(10, 2, 4)
    with pytest.raises(ValueError, match="optimizer"):
        predict.predict_run(TINY, Grid(dp=2), 8, optimizer="lion")
    with pytest.raises(NotImplementedError):
        predict.predict_run(TINY, Grid(pp=2), 8, engine="torch")
    with pytest.raises(ValueError, match="stage 2 is outside 0..1"):
        predict.predict_run(TINY, Grid(pp=2), 8, stage=2)
    with pytest.raises(ValueError, match="does not split into 3 micro-batches"):
        predict.predict_run(TINY, Grid(pp=2), 8, micro_batches=3)


# -- context parallelism (chapter 8's axis in the planner) --------------------------------------------

LLAMA70B_128K = Model(layers=80, hidden=8192, heads=64, vocab=128256, seq=131072, mlp_ratio=4.375,
                      biases=False, learned_positions=False, kv_heads=8)
LONG = Training(global_batch=128, micro_batch=1, recompute="selective", sequence_parallel=True)


@pytest.mark.parametrize("n, seq, batch, heads, head_dim, size", [(2, 16, 1, 4, 8, 8), (4, 64, 3, 2, 16, 4),
                                                                   (8, 131072, 1, 1, 128, 2)])
def test_the_planners_ring_bytes_are_chapter_8s(n, seq, batch, heads, head_dim, size):
    """The planner restates ring attention's byte count (distlab.context_parallel.ring needs torch): the same numbers."""
    from distlab.context_parallel import ring
    from distlab.parallel3d import context
    for backward in (False, True):
        assert (context.ring_kv_bytes(n, seq, batch, heads, head_dim, size, backward)
                == ring.ring_bytes(n, seq, batch, heads, head_dim, size, backward))
    # by hand for the first case: blocks of 2 x 1 x 4 x 8 tokens x 8 wide x 8 bytes = 4096; 1 forward, 3 backward
    assert context.ring_kv_bytes(2, 16, 1, 4, 8, 8) == 4096 and context.ring_kv_bytes(2, 16, 1, 4, 8, 8, True) == 3 * 4096


def test_context_parallelism_by_hand_for_llama_70b_at_128k_tokens():
    cluster = Cluster(gpus=512)
    e = planner.estimate(LLAMA70B_128K, cluster, LONG, Grid(dp=8, tp=8), zero=1, cp=8)
    assert e.micro_batches == 128 // 8 == 16
    # activations, selective recomputation with SP: 34 s b h / tp bytes per layer in bf16, a rank's
    # s / cp = 16384 tokens of them, 80 layers, one micro-batch in flight (no pipeline)
    per_layer = 34 * 131072 * 8192 // 8 // 8
    assert per_layer == 570_425_344
    assert e.memory["activations"] == 80 * per_layer == 45_634_027_520              # 42.5 GiB
    # model states: tp leaves P_rank on a rank, ZeRO-1 shards Adam's 12 bytes over dp * cp = 64 ranks
    p_rank = LLAMA70B_128K.params_on_rank(tp=8)
    assert e.memory["parameters"] == 2 * p_rank and e.memory["optimizer"] == 12 * p_rank / 64
    # ring attention: 8 kv heads / tp 8 = 1 per rank, head_dim 128, bf16: a block is
    # 2 x 1 x 16384 x 128 x 2 bytes = 8 MiB; 7 blocks forward + 15 backward per layer, 80 layers, 16 micro-batches
    assert e.comm_bytes["cp"] == 80 * 16 * (7 + 15) * 8 * 2**20 == 236_223_201_280
    # tp's all-reduces carry the rank's 16384 tokens only: 4 per layer of 16384 x 8192 x 2 bytes, 2 x 7/8 of it
    assert e.comm_bytes["tp"] == 80 * 16 * 4 * (2 * 7 / 8 * 16384 * 8192 * 2)
    # the gradient reduction runs over dp * cp = 64 ranks: 2 x 63/64 x 2-byte gradients
    assert e.comm_bytes["dp"] == 2 * 63 / 64 * 2 * p_rank
    # cp sits next to tp: a cp group spans tp * cp = 64 ranks, eight nodes; dp groups are 64 ranks apart
    assert e.links == {"tp": "intra", "cp": "inter", "dp": "inter", "pp": None}
    assert e.fits and "dp=8 pp=1 tp=8 cp=8 ZeRO-1" in e.describe()


def test_context_parallelism_shrinks_activations_not_parameters_and_its_ring_hides_behind_attention():
    cluster = Cluster(gpus=512)
    without = planner.estimate(LLAMA70B_128K, cluster, LONG, Grid(dp=64, tp=8), zero=3)
    with_cp = planner.estimate(LLAMA70B_128K, cluster, LONG, Grid(dp=8, tp=8), zero=3, cp=8)
    assert not without.fits and with_cp.fits                          # 342 GiB against 44 GiB
    assert with_cp.memory["activations"] == without.memory["activations"] / 8
    for kind in ("parameters", "gradients", "optimizer"):              # ZeRO-3 over 64 ranks either way
        assert with_cp.memory[kind] == without.memory[kind]
    # the ring's 220 GiB over 25 GB/s take 9.4 s; the causal attention of the rank's 16384 queries
    # against 131072 keys, 8 heads of 128, x3 for backward, 80 layers, 16 micro-batches at 40% of
    # 989 TFLOP/s takes 42.7 s: the ring is hidden, and the step is compute + tp + the dp excess
    attention = 80 * 16 * 3 * 2 * 2 * 8 * 16384 * 131072 * 128 / 2 / (989e12 * 0.4)
    assert attention == pytest.approx(42.69, rel=1e-3)
    assert with_cp.comm_seconds["cp"] == pytest.approx(236_223_201_280 / 25e9)
    dp_excess = max(0.0, with_cp.comm_seconds["dp"] - with_cp.ideal_seconds)
    assert with_cp.step_seconds == pytest.approx(with_cp.compute_seconds + with_cp.comm_seconds["tp"] + dp_excess)
    # on a 0.1 GB/s network the ring no longer hides: only its excess over the attention counts
    slow = planner.estimate(LLAMA70B_128K, Cluster(gpus=512, inter_bandwidth=0.1e9), LONG, Grid(dp=8, tp=8), 3, cp=8)
    dp_excess = max(0.0, slow.comm_seconds["dp"] - slow.ideal_seconds)
    assert slow.step_seconds == pytest.approx(slow.compute_seconds + slow.comm_seconds["tp"] + dp_excess
                                              + slow.comm_seconds["cp"] - attention)


def test_recommend_reaches_context_parallelism_only_when_the_sequence_is_what_does_not_fit():
    advice = recommend.recommend(LLAMA70B_128K, Cluster(gpus=512), LONG)
    text = str(advice)
    assert "dp=64 pp=1 tp=8: even with ZeRO-3, 342.1 GiB/GPU does not fit" in text
    assert "dp=16 pp=1 tp=8 cp=4: even with ZeRO-3, 87.1 GiB/GPU does not fit" in text
    assert (advice.choice.grid, advice.choice.cp) == (Grid(dp=8, tp=8), 8) and advice.steps[-2].startswith("  dp=8")
    short = recommend.recommend(Model(layers=32, hidden=4096, heads=32, vocab=50304, seq=2048), Cluster(gpus=64),
                                Training(global_batch=512, micro_batch=2))
    assert not any(line.startswith("4.") for line in short.steps)
    ranked = recommend.rank_layouts(LLAMA70B_128K, Cluster(gpus=512), LONG, zero_stages=(3,), cps=(1, 8))
    # without cp only tp across nodes (16 ranks and more, each split of the sequence's activations) fits
    assert {e.cp for e in ranked if e.fits and e.grid.tp <= 8} == {8} and {e.cp for e in ranked} == {1, 8}


def test_bad_context_parallel_sizes_are_refused():
    with pytest.raises(ValueError, match=r"dp \* pp \* tp \* cp = 64 \* 8 ranks, but there are 64 GPUs"):
        planner.estimate(LLAMA70B_128K, Cluster(gpus=64), LONG, Grid(dp=8, tp=8), cp=8)
    with pytest.raises(ValueError, match=r"cp=3 does not divide the sequence length \(131072\)"):
        planner.estimate(LLAMA70B_128K, Cluster(gpus=24), LONG, Grid(dp=8), cp=3)
