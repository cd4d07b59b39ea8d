"""Collective bytes read from compiled HLO: every collective, and the part inside a conditional's branches."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from benchmarks.hlo import collective_bytes, conditional_collective_bytes, step_collective_bytes


def test_collectives_in_a_cond_branch_are_counted_apart():
    """A psum outside any cond and an all-gather in one branch: both in the total, only the gather in the
    conditional part (it moves only on steps that take the branch)."""
    mesh = Mesh(np.array(jax.devices()), ("x",))
    n = mesh.size

    def body(x, flag):
        s = jax.lax.psum(jnp.sum(x), "x")  # 4 bytes in, every step
        g = jax.lax.cond(flag, lambda v: jnp.sum(jax.lax.all_gather(v, "x", tiled=True)), lambda v: jnp.float32(0), x)
        return s + g

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P(), check_vma=False))
    x = jax.device_put(np.ones(n * 16, np.float32), NamedSharding(mesh, P("x")))
    text = f.lower(x, True).compile().as_text()
    total, branch = collective_bytes(text), conditional_collective_bytes(text)
    assert branch["all-gather"] == 16 * 4 and branch["all-reduce"] == 0 and branch["total"] == 16 * 4
    assert total["all-gather"] == 16 * 4 and total["all-reduce"] >= 4
    assert conditional_collective_bytes("") == {**{k: 0 for k in branch if k != "total"}, "total": 0}


def test_a_step_counts_one_branch_of_each_cond():
    """Two branches with all-to-alls of 16 and 64 floats: the total counts both, a usual step the cheaper one,
    the dearest step the other (as a routed step and its rerouted overflow)."""
    mesh = Mesh(np.array(jax.devices()), ("x",))
    n = mesh.size

    def body(x, flag):
        def move(v):
            return jnp.sum(jax.lax.all_to_all(v.reshape(n, -1), "x", 0, 0, tiled=True))
        return jax.lax.cond(flag, lambda v: move(jnp.tile(v, 4)), move, x)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P(), check_vma=False))
    x = jax.device_put(np.ones(n * 16, np.float32), NamedSharding(mesh, P("x")))
    text = f.lower(x, True).compile().as_text()
    assert collective_bytes(text)["all-to-all"] == (16 + 64) * 4
    assert step_collective_bytes(text)["all-to-all"] == 16 * 4 == step_collective_bytes(text)["total"]
    assert step_collective_bytes(text, "dearest")["all-to-all"] == 64 * 4


def test_a_step_runs_loop_bodies_with_collectives_zero_times_or_once():
    """An all-to-all of 16 floats every step and one of 32 in a loop body whose trip count is data (the extra
    rounds of an overflowing routed step): a usual step counts the first only, the dearest one round more."""
    mesh = Mesh(np.array(jax.devices()), ("x",))
    n = mesh.size

    def body(x, rounds):
        def move(v):
            return jax.lax.all_to_all(v.reshape(n, -1), "x", 0, 0, tiled=True).reshape(-1)
        first = move(x)
        more = jax.lax.fori_loop(1, rounds, lambda r, acc: acc + move(jnp.tile(x, 2) * r)[: x.shape[0]], first)
        return jnp.sum(more)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P(), check_vma=False))
    x = jax.device_put(np.ones(n * 16, np.float32), NamedSharding(mesh, P("x")))
    text = f.lower(x, 1).compile().as_text()
    assert collective_bytes(text)["all-to-all"] == (16 + 32) * 4
    assert step_collective_bytes(text)["all-to-all"] == 16 * 4 == step_collective_bytes(text)["total"]
    assert step_collective_bytes(text, "dearest")["all-to-all"] == (16 + 32) * 4
