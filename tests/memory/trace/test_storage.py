import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from labkit.memory.trace.storage import Roles, StorageTracker, categorise, round_up


def test_round_up_like_the_caching_allocator():
    assert round_up(0, 512) == 0
    assert round_up(1, 512) == 512
    assert round_up(512, 512) == 512
    assert round_up(513, 512) == 1024
    assert round_up(4, 1) == 4


def test_tracks_allocations_and_frees_with_rounding():
    tr = StorageTracker(rounding=512)
    with tr:
        a = torch.empty(1000)          # 4000 B -> 4096
        b = a * 2                      # another 4096
        v = b[:10]                     # a view: no new storage
        assert tr.current == 8192
        del b
        assert tr.current == 8192      # the view keeps b's storage alive
        del v
        assert tr.current == 4096
        c = torch.empty(3, dtype=torch.int8)   # 3 B -> 512
        assert tr.current == 4096 + 512
    assert max(tr.phase_peaks) == 8192 + 512 or max(tr.phase_peaks) == 8192
    del a, c
    assert tr.current == 0


def test_phases_peaks_transients_and_holds():
    tr = StorageTracker(rounding=512)
    with tr:
        tr.begin_phase("one")
        x = torch.empty(256)           # 1024 B
        tmp = torch.empty(2048)        # 8192 B
        del tmp
        i1 = tr.phase_index
        tr.begin_phase("two")
        tr.transient(100_000)           # 100352 B, only inside the op
        sid = tr.hold(1000)             # 1024 B lasting
        tr.resize(x, 10_000)            # x is accounted as 10240 B from now
    assert tr.phase_peaks[i1] == 1024 + 8192
    assert tr.phase_peaks[tr.phase_index] == 1024 + 100352 + 0 or tr.phase_peaks[tr.phase_index] == 1024 + 100352
    assert tr.current == 10240 + 1024
    assert sid in tr.live
    del x
    assert tr.current == 1024


def test_works_on_fake_tensors_without_memory():
    tr = StorageTracker(device_type="meta", rounding=512)
    with FakeTensorMode():
        with tr:
            big = torch.empty(1 << 30, dtype=torch.float32)   # 4 GiB, faked
            assert tr.current == 4 << 30
            q = torch.randn(2, 4, 64, 16, requires_grad=True)
            out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
            out.sum().backward()
            del big
            assert tr.current >= q.numel() * 4 * 2   # q and its gradient at least


def test_categorise_by_role_and_phase():
    tr = StorageTracker(rounding=1)
    with tr:
        p = torch.nn.Parameter(torch.empty(100))          # 400 B, untracked: created before? no, tracked
        roles = Roles()
        tr.track(p)
        roles.add(tr, "parameters", [p])
        f = tr.begin_phase("forward")
        act = p * 2                                        # 400 B activation
        tmp = p + 1                                        # 400 B temporary (freed in backward)
        b = tr.begin_phase("backward")
        g = torch.empty(100)                               # 400 B gradient
        roles.add(tr, "gradients", [g])
        junk = torch.empty(10)                             # 40 B temporary
        cats = categorise(tr, roles, len(tr.events), (f,))
    assert cats["parameters"] == 400
    assert cats["gradients"] == 400
    assert cats["activations"] == 800          # act and tmp were born in the forward and are alive
    assert cats["temporaries"] == 40
    del act, tmp, g, junk, b


def test_a_device_query_is_answered_without_reaching_the_op_log_or_the_emulator():
    """``tensor.device`` of a FakeTensor dispatches ``prim.device`` to every mode: the tracker answers it with the
    tensor's own fake device (what FakeTensor answers) and logs, observes and emulates nothing for it."""
    from labkit.memory.trace.storage import DEVICE_QUERY, device_of

    seen = []
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.empty(4, 4))
        x.fake_device = torch.device("cuda", 0)          # as fake mode's tensors say they are on the GPU
        tr = StorageTracker(device_type="cpu", op_log=True, observers=(lambda f, *rest: seen.append(f),))
        with tr:
            assert x.device == torch.device("cuda", 0)
            y = x * 2
    assert device_of((x,), None) == torch.device("cuda", 0) and y.device == torch.device("cuda", 0)
    assert DEVICE_QUERY not in seen and [r.name for r in tr.op_log] == ["aten.mul.Tensor"]
    assert device_of((torch.empty(1),), None) == torch.device("cpu")    # a plain tensor: the op itself
