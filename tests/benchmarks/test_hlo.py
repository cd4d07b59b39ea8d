"""Collective bytes read from compiled HLO: every collective, and the part inside a conditional's branches."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from benchmarks.hlo import collective_bytes, conditional_collective_bytes


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
