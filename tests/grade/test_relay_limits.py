"""What the relay's router may hold for the ranks (distlab.relay.router, distlab.relay.holdings): a rank that floods it
stops its run with a verdict that names it, and the router's process stays small.

The router lives in the process that launched the ranks: here this test's process, in grading
the clean room. Each attack is a rank of a relay run that makes the router hold more and more:
messages to a rank that reads nothing (its link's reader paused, as student code may do),
a frame that announces gigabytes, a flood of empty messages (by their number, and by their
whole frames when their headers are fat). The caps are lowered for the test (the router reads
them when it checks); the process's peak resident size must stay far below what the attack sent.
Also here: what travels beside a message's payload (its tag, its tensor's description, a
collective's name), which the record does not count, is held to what torch itself sends; and a
pool whose router a flood stopped gets fresh ranks for its next call.
"""

from __future__ import annotations

import os
import resource
import time

import pytest
import torch
import torch.distributed as dist

import distlab
from distlab.relay import frames, holdings

MiB = 1 << 20
CAP_MB = 16


@pytest.fixture
def small_caps(monkeypatch):
    monkeypatch.setattr(holdings, "MOST_HELD_PER_RANK", CAP_MB * MiB)
    monkeypatch.setattr(holdings, "MOST_HELD_TOTAL", 4 * CAP_MB * MiB)
    monkeypatch.setattr(holdings, "MOST_UNRECEIVED_MESSAGES", 2000)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _wait_to_be_ended(seconds=40):
    """Rank 0 of an attack: stop reading the relay and wait (until the run ends it)."""
    from distlab.relay import link

    link.link().pause_reader()
    time.sleep(seconds)
    return "waited"


def _send_without_waiting(tensor, times):
    """``times`` sends that do not wait for their receiver (a blocking send on the relay waits
    until the receiver took its message, as on gloo, so only these can pile up)."""
    sends = [dist.isend(tensor, 0) for _ in range(times)]
    for send in sends:
        send.wait()


def flood_a_rank_that_reads_nothing(total_mb, chunk_mb):
    if dist.get_rank() == 0:
        return _wait_to_be_ended()
    _send_without_waiting(torch.zeros(chunk_mb * MiB // 4), total_mb // chunk_mb)
    return "sent"


def announce_a_huge_frame(announced_mb):
    if dist.get_rank() == 0:
        return _wait_to_be_ended()
    header = frames.pack({"k": "send", "dst": 0, "tag": 0, "parts": [["uint8", [announced_mb * MiB]]]},
                         announced_mb * MiB)
    os.write(int(os.environ["DISTLAB_RELAY_FD"]), header + b"x" * 4096)
    time.sleep(2)
    dist.barrier()      # the router answers nothing until the huge frame is complete
    return "announced"


def flood_empty_messages(count):
    if dist.get_rank() == 0:
        return _wait_to_be_ended()
    _send_without_waiting(torch.zeros(0), count)
    return "sent"


def flood_empty_messages_with_fat_headers(count, header_kb):
    """Rank 1 writes ``count`` empty messages to rank 0, fewer than the cap on their number, each
    with ``header_kb`` KiB of padding in its header (the router reads and drops it), then waits
    in a barrier; rank 0 receives nothing. Only a cap that counts whole frames stops it."""
    from distlab.relay import link

    if dist.get_rank() == 0:
        return _wait_to_be_ended(30)
    padding = "x" * (header_kb * 1024)
    for number in range(count):
        link.link().send({"k": "send", "dst": 0, "tag": 0, "parts": [["float32", [0]]], "id": -1 - number,
                          "padding": padding}, [])
    dist.barrier()
    return "sent"


def send_data_in_the_envelope(how):
    """Rank 1 sends rank 0 an empty message whose envelope carries 64 bits (the record counts 0
    bytes): in the dtypes of 64 empty tensors, or in a tag far past torch's 32 bits. Rank 0
    looks into its mailbox without receiving, then both meet in a barrier."""
    from distlab.relay import link

    secret = [(0xC0FFEE >> i) & 1 for i in range(64)]
    if dist.get_rank() == 1:
        if how == "parts":
            header = {"k": "send", "dst": 0, "tag": 0, "parts": [["uint8" if b else "int8", [0]] for b in secret]}
        else:
            header = {"k": "send", "dst": 0, "tag": int("".join(map(str, secret)), 2) << 40, "parts": [["uint8", [0]]]}
        link.link().send(dict(header, id=-1), [])
        dist.barrier()
        return None
    time.sleep(2)
    seen = {key: [message[0] for message in messages] for key, messages in link.link()._arrived.items()}
    dist.barrier()
    return repr(seen)


def tell_the_others_in_a_collective_s_name():
    """Rank 1 hands in rank 0's barrier under an operation named by a secret: when the names of a
    group's collectives differ, the router tells every rank what each one called. Then rank 1
    calls a barrier of its own (which fails with what the router told it)."""
    from distlab.relay import link

    world = dist.distributed_c10d._get_default_group()
    if dist.get_rank() == 1:
        link.link().send({"k": "coll", "op": "secret:" + "42" * 500, "group": world._group_id,
                          "ranks": world._ranks, "seq": world._seq, "parts": []}, [])
        time.sleep(1)
    dist.barrier()
    return "passed"


def test_a_collective_named_by_a_rank_s_own_string_never_reaches_the_others():
    with pytest.raises(distlab.RankError) as failed:
        distlab.run(tell_the_others_in_a_collective_s_name, nprocs=2, backend="relay", timeout=30)
    assert "the relay does not perform 'secret:4242" in str(failed.value), str(failed.value)
    assert "4242" * 30 not in str(failed.value)


def test_empty_messages_are_capped_by_their_whole_frames_not_only_their_payloads(small_caps):
    message, grew_mb = _attack(flood_empty_messages_with_fat_headers, 1500, 16)   # 24 MiB of headers
    assert f"rank 1 sent more than {CAP_MB} MiB that rank 0 has not received" in message, message
    assert grew_mb < 8 * CAP_MB, f"the router's process grew by {grew_mb:.0f} MiB"


@pytest.mark.parametrize("how, refusal", [("parts", "64 tensors in one message (a send carries one tensor)"),
                                          ("tag", "torch's tags are 32-bit integers")])
def test_a_send_whose_envelope_carries_data_is_refused(how, refusal):
    with pytest.raises(distlab.RankError) as failed:
        distlab.run(send_data_in_the_envelope, how, nprocs=2, backend="relay", timeout=60)
    assert "rank 1's send to rank 0: " in str(failed.value) and refusal in str(failed.value), str(failed.value)


def _attack(fn, *args):
    before = _peak_mb()
    with pytest.raises(distlab.RankError) as failed:
        distlab.run(fn, *args, nprocs=2, backend="relay", timeout=120)
    return str(failed.value), _peak_mb() - before


def test_a_rank_flooding_one_that_reads_nothing_is_stopped_and_named(small_caps):
    message, grew_mb = _attack(flood_a_rank_that_reads_nothing, 512, 4)
    assert f"rank 1 sent more than {CAP_MB} MiB that rank 0 has not received" in message, message
    assert grew_mb < 8 * CAP_MB, f"the router's process grew by {grew_mb:.0f} MiB"


def test_a_frame_announcing_gigabytes_is_refused_before_any_is_held(small_caps):
    message, grew_mb = _attack(announce_a_huge_frame, 1536)
    assert "rank 1 announced a message of 1536 MiB" in message, message
    assert grew_mb < 8 * CAP_MB, f"the router's process grew by {grew_mb:.0f} MiB"


def test_a_flood_of_empty_messages_is_stopped_and_named(small_caps):
    message, _ = _attack(flood_empty_messages, 50_000)
    assert "rank 1 sent more than 2000 messages that rank 0 has not received" in message, message


def honest_exchange(numel, rounds):
    """Both ranks send their right neighbour twice the cap, in pieces, each received in turn."""
    r, n = dist.get_rank(), dist.get_world_size()
    total = torch.zeros(numel)
    for step in range(rounds):
        out, back = torch.full((numel,), float(r + step)), torch.empty(numel)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, (r + 1) % n),
                                            dist.P2POp(dist.irecv, back, (r - 1) % n)]):
            work.wait()
        total += back
    dist.all_reduce(total)
    return total[:3].tolist()


def test_honest_traffic_far_over_the_cap_in_total_passes(small_caps):
    numel, rounds = MiB // 4, 2 * CAP_MB       # 1 MiB a message, twice the cap per rank in all
    got = distlab.run(honest_exchange, numel, rounds, nprocs=2, backend="relay", timeout=120)
    expected = float(sum(2 * step + 1 for step in range(rounds)))   # (0 + s) + (1 + s), exact in float32
    assert got == [[expected] * 3] * 2


def flood_and_catch_the_verdict(total_mb, chunk_mb, then):
    """Rank 1 floods rank 0, which waits in a barrier: the router stops the run at the cap. Both
    ranks catch the verdict and either return it or raise an error of their own after wiping
    their own note of the distributed call that raised (what a pool reads to decide whether a
    failed call left the process group in doubt; the rank's code can edit it): either way the
    pool sees every rank finish the call cleanly, though their links to the router are broken."""
    try:
        if dist.get_rank() == 0:
            dist.barrier()
        else:
            _send_without_waiting(torch.zeros(chunk_mb * MiB // 4), total_mb // chunk_mb)
    except RuntimeError as stopped:
        if then == "raise":
            from distlab.tools import comm

            comm.forget_pending()
            raise ValueError(f"caught: {stopped}") from None
        return str(stopped)
    return "not stopped"


@pytest.mark.parametrize("then", ["raise", "return"])
def test_a_pool_whose_network_a_flood_stopped_serves_the_next_run(small_caps, capfd, then):
    verdict = f"rank 1 sent more than {CAP_MB} MiB that rank 0 has not received"
    with distlab.Pool(2, backend="relay", launcher="fork") as pool:
        if then == "raise":
            with pytest.raises(distlab.RankError, match=verdict):
                pool.run(flood_and_catch_the_verdict, 4 * CAP_MB, 4, then, timeout=120)
        else:
            assert all(verdict in said for said in pool.run(flood_and_catch_the_verdict, 4 * CAP_MB, 4, then,
                                                            timeout=120))
        got = pool.run(honest_exchange, 1024, 3, timeout=120)      # the same pool, an honest run
    assert got == [[9.0] * 3] * 2        # (0 + s) + (1 + s) for s = 0, 1, 2: exact in float32
    assert "the grader's network stopped the previous call" in capfd.readouterr().err
