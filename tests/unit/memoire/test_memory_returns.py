"""Lambda-returns (qvest) and priority weights of memoire.ReplayMemory against a NumPy reference,
and sampling frequencies against the weights."""

import numpy as np
import pytest

import memoire

FLOAT = np.float32


def reference_returns(r, v, gamma, lam, terminal):
    """G[L-1] = r (terminated) or v (truncated); G[k] = r[k] + gamma*((1-lam)*v[k+1] + lam*G[k+1]).

    r, v: float[L, R]; gamma: float[R]. Returns float64[L, R].
    """
    r = r.astype(np.float64)
    v = v.astype(np.float64)
    gamma = np.asarray(gamma, np.float64)
    g = np.zeros_like(r)
    g[-1] = r[-1] if terminal else v[-1]
    for k in range(len(r) - 2, -1, -1):
        g[k] = r[k] + gamma * ((1 - lam) * v[k + 1] + lam * g[k + 1])
    return g


def reference_weights(q, v, init_w, mult, alpha, eps, coeff, update_weight=True):
    w = mult * init_w.astype(np.float64)
    if update_weight and alpha != 0:
        td = (np.asarray(coeff, np.float64) * (q.astype(np.float64) - v)).sum(axis=1)
        w = w * (np.abs(td) + eps) ** alpha
    return w


def make(reward_shape, max_step=200, seed=0):
    rem = memoire.ReplayMemory(
        np.zeros([1], np.int64),
        np.zeros([], FLOAT),
        np.zeros(reward_shape, FLOAT),
        np.zeros([], FLOAT),
        np.zeros(reward_shape, FLOAT),
        np.zeros(reward_shape, FLOAT),
        np.zeros([0], np.uint8),
        max_step,
    )
    rem.seed(seed)
    return rem


def add_episode(rem, r, v, init_w, first_id, **close_kwargs):
    """Adds and closes one episode; returns the memory's total weight before it."""
    n = len(r)
    rshape = rem.reward_buf.shape
    total_before = rem.total_weight
    rem.new_episode()
    rem.add_entries(
        np.arange(first_id, first_id + n)[:, None],
        np.zeros(n, FLOAT),
        r.reshape((n,) + rshape),
        np.zeros(n, FLOAT),
        v.reshape((n,) + rshape),
        np.zeros([n, 0], np.uint8),
        init_w,
    )
    rem.close_episode(**close_kwargs)
    return total_before


def stored(rem, n_draws):
    """{id: (q, weight, next q)} for the entries drawn in one batch of n_draws."""
    out = {}
    b = rem.get_batch(n_draws)
    for k, i in enumerate(b.id.tolist()):
        out[i] = (b.prev[5][k, -1].reshape(-1), float(b.weight[k]), b.next[5][k, -1].reshape(-1))
    return out


def check_episode(rem, first_id, q_ref, w_ref, total_before):
    """Checks weights (of drawn entries and the total), then qvest of every entry of the episode.

    With frame_stack = multi_step = 1, entries 0..L-2 are sampleable and entry k's next is k+1.
    """
    L = len(q_ref)
    assert rem.total_weight == pytest.approx(total_before + w_ref[: L - 1].sum(), rel=1e-5)
    for i, (_, w, _) in stored(rem, 50 * L).items():
        if first_id <= i < first_id + L:
            assert w_ref[i - first_id] > 0
            np.testing.assert_allclose(w, w_ref[i - first_id], rtol=1e-5)
    # Equal weights make every entry show up in a stratified batch at least as large as the
    # number of sampleable entries; then read each entry's qvest.
    ids = np.arange(first_id + L)
    rem.update_weights(ids, np.ones(len(ids), FLOAT))
    got = stored(rem, rem.num_sampleable)
    for k in range(L - 1):
        q, w, q_next = got[first_id + k]
        np.testing.assert_allclose(q, q_ref[k], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(q_next, q_ref[k + 1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reward_shape", [(), (3,), (2, 2)])
@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("terminal", [True, False])
def test_lambda_returns_per_reward_dimension(reward_shape, lam, terminal):
    R = int(np.prod(reward_shape))
    rng = np.random.default_rng(R * 100 + int(lam * 20) + terminal)
    rem = make(reward_shape)
    gamma = np.linspace(0.5, 1.0, R).astype(FLOAT)
    rem.discount_factor = gamma
    rem.mix_lambda = lam
    rem.priority_exponent = 0.7
    rem.priority_epsilon = 0.01
    coeff = rng.uniform(-1, 1, R).astype(FLOAT)
    rem.reward_coeff = coeff
    first = 0
    for L in (2, 7, 15):
        r = rng.normal(size=(L, R)).astype(FLOAT)
        v = rng.normal(size=(L, R)).astype(FLOAT)
        init_w = rng.uniform(0.5, 2.0, L).astype(FLOAT)
        before = add_episode(rem, r, v, init_w, first, terminal=terminal)
        q_ref = reference_returns(r, v, gamma, lam, terminal)
        w_ref = reference_weights(q_ref, v, init_w, 1.0, 0.7, 0.01, coeff)
        check_episode(rem, first, q_ref, w_ref, before)
        first += L


def test_terminal_and_truncated_differ_only_through_the_last_entry():
    rem = make([])
    rem.mix_lambda = 1.0
    rem.discount_factor = 0.5
    r = np.array([[1.0], [2.0], [4.0]], FLOAT)
    v = np.array([[0.0], [0.0], [8.0]], FLOAT)
    add_episode(rem, r, v, np.ones(3, FLOAT), 0, terminal=True)
    add_episode(rem, r, v, np.ones(3, FLOAT), 3, terminal=False)
    got = stored(rem, 4)
    # Terminated: G2 = 4, G1 = 2 + .5*4 = 4, G0 = 1 + .5*4 = 3.
    assert got[0][0][0] == pytest.approx(3.0) and got[1][0][0] == pytest.approx(4.0)
    assert got[1][2][0] == pytest.approx(4.0)
    # Truncated: G2 = v2 = 8, G1 = 2 + .5*8 = 6, G0 = 1 + .5*6 = 4.
    assert got[3][0][0] == pytest.approx(4.0) and got[4][0][0] == pytest.approx(6.0)
    assert got[4][2][0] == pytest.approx(8.0)


def test_do_update_value_false_keeps_qvest_zero():
    rng = np.random.default_rng(1)
    rem = make([2])
    rem.priority_exponent = 0.5
    L = 9
    r = rng.normal(size=(L, 2)).astype(FLOAT)
    v = rng.normal(size=(L, 2)).astype(FLOAT)
    init_w = np.ones(L, FLOAT)
    before = add_episode(rem, r, v, init_w, 0, do_update_value=False)
    q = np.zeros((L, 2))
    # Weights still follow the formula, with the q that is stored (zero).
    w_ref = reference_weights(q, v, init_w, 1.0, 0.5, 1e-6, [1.0, 1.0])
    check_episode(rem, 0, q, w_ref, before)


def test_do_update_weight_false_keeps_init_w_times_multiplier():
    rng = np.random.default_rng(2)
    rem = make([])
    rem.priority_exponent = 0.9
    L = 8
    r = rng.normal(size=(L, 1)).astype(FLOAT)
    v = rng.normal(size=(L, 1)).astype(FLOAT)
    init_w = rng.uniform(0.1, 3, L).astype(FLOAT)
    before = add_episode(
        rem, r, v, init_w, 0, do_update_weight=False, episodic_weight_multiplier=2.5
    )
    q_ref = reference_returns(r, v, [0.99], 0.95, True)
    check_episode(rem, 0, q_ref, 2.5 * init_w.astype(np.float64), before)


@pytest.mark.parametrize("mult", [0.0, 0.5, 3.0])
@pytest.mark.parametrize("alpha", [0.0, 0.4, 1.0, 2.0])
def test_episodic_multiplier_and_priority_exponent(mult, alpha):
    rng = np.random.default_rng(int(mult * 10 + alpha * 100))
    rem = make([2])
    rem.priority_exponent = alpha
    rem.priority_epsilon = 0.05
    rem.reward_coeff = [2.0, -0.5]
    rem.discount_factor = [0.9, 0.8]
    L = 12
    r = rng.normal(size=(L, 2)).astype(FLOAT)
    v = rng.normal(size=(L, 2)).astype(FLOAT)
    init_w = rng.uniform(0.1, 3, L).astype(FLOAT)
    init_w[3] = 0.0
    # A second episode keeps the memory sampleable when mult == 0.
    add_episode(rem, np.ones((4, 2), FLOAT), np.zeros((4, 2), FLOAT), np.ones(4, FLOAT), 0)
    n_before = rem.num_sampleable
    assert n_before == 3
    before = add_episode(rem, r, v, init_w, 4, episodic_weight_multiplier=mult)
    q_ref = reference_returns(r, v, [0.9, 0.8], 0.95, True)
    w_ref = reference_weights(q_ref, v, init_w, mult, alpha, 0.05, [2.0, -0.5])
    assert rem.num_sampleable == n_before + int((w_ref[: L - 1] > 0).sum())
    check_episode(rem, 4, q_ref, w_ref, before)


def test_settings_apply_to_episodes_closed_after_the_change():
    rem = make([])
    rem.priority_exponent = 1.0
    r = np.array([[1.0], [1.0], [1.0]], FLOAT)
    v = np.zeros((3, 1), FLOAT)
    add_episode(rem, r, v, np.ones(3, FLOAT), 0)
    rem.priority_exponent = 0.0
    rem.discount_factor = 0.0
    add_episode(rem, r, v, np.ones(3, FLOAT), 3)
    got = stored(rem, 40)
    assert got[0][0][0] == pytest.approx(1 + 0.99 * 0.95 * (1 + 0.99 * 0.95))
    assert got[0][1] == pytest.approx(got[0][0][0] + 1e-6, rel=1e-5)
    assert got[3][0][0] == pytest.approx(1.0) and got[3][1] == 1.0


def test_sampling_frequencies_follow_weights():
    rem = make([], max_step=100, seed=11)
    rng = np.random.default_rng(3)
    w = rng.uniform(0.0, 5.0, 40).astype(FLOAT)
    w[[4, 17]] = 0.0
    w[9] = 20.0
    r = np.zeros((41, 1), FLOAT)
    add_episode(rem, r, r, np.append(w, 1.0).astype(FLOAT), 0)  # entry 40 is the last: unsampled
    counts = np.zeros(41)
    draws = 0
    for _ in range(200):
        b = rem.get_batch(100)
        np.testing.assert_allclose(b.prob, w[b.id] / w.sum(), rtol=1e-5)
        np.testing.assert_array_equal(b.weight, w[b.id])
        counts += np.bincount(b.id, minlength=41)
        draws += 100
    assert counts[[4, 17, 40]].sum() == 0
    expected = draws * w / w.sum()
    live = expected > 0
    chi2 = (((counts[:40][live] - expected[live]) ** 2) / expected[live]).sum()
    # 37 degrees of freedom: the 99.9% quantile is about 69; stratified draws sit far below it.
    assert chi2 < 69, chi2
    # A skewed memory: the one heavy entry takes its share.
    assert counts[9] / draws == pytest.approx(20.0 / w.sum(), rel=0.05)
