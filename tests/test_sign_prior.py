"""model.sign_prior: a fixed sign (−1)^(up spins on marked cells) on the ViT's ψ."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import (
    assert_one_line_error,
    model_config,
    model_vector,
    rayleigh_quotient,
    run_main,
    tiny_heisenberg,
    write_config,
)
from vitqs.models.build import build_model, sign_prior_sites
from vitqs.physics.hilbert import SpinHalf
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import Heisenberg
from vitqs.vmc.sr import log_derivatives

SQUARE = Lattice((4, 2))
TRIANGULAR = Lattice((4, 2), kind="triangular")


def _pair(lattice, prior, **overrides):
    """Returns the model with ``prior`` and the same parameters without it."""
    hilbert = SpinHalf(lattice.n_sites, 0)
    torch.manual_seed(1)
    with_prior = build_model(model_config(sign_prior=prior, **overrides), lattice, hilbert)
    without = build_model(model_config(**overrides), lattice, hilbert)
    without.load_state_dict(with_prior.state_dict())
    return with_prior, without, hilbert


@pytest.mark.parametrize(
    ("prior", "marked_cells"),
    [
        ("stripes_x", lambda x, y: x % 2),
        ("stripes_y", lambda x, y: y % 2),
        ("stripes_xy", lambda x, y: (x + y) % 2),
    ],
)
def test_the_prior_multiplies_psi_by_minus_one_per_up_spin_on_a_marked_cell(prior, marked_cells):
    with_prior, without, hilbert = _pair(TRIANGULAR, prior)
    states = torch.as_tensor(hilbert.all_states(), dtype=torch.float64)
    x, y = TRIANGULAR.coords.T
    marked = torch.as_tensor(marked_cells(x, y) == 1)
    sign = 1.0 - 2.0 * ((states[:, marked] > 0).sum(dim=1) % 2).double()
    with torch.no_grad():
        ratio = torch.exp(with_prior(states) - without(states))
    assert torch.allclose(ratio, sign.to(ratio.dtype), atol=1e-12, rtol=0)
    assert 0 < (sign < 0).sum() < len(sign)  # both signs occur: the check could fail


def test_stripes_xy_on_the_square_lattice_is_the_marshall_rotation():
    """The same parameters give the same energy as ψ·(Marshall sign) on H and as bare ψ on
    the Marshall-rotated H (`Heisenberg(sign_rule=True)`): the prior is that rotation."""
    with_prior, without, hilbert = _pair(SQUARE, "stripes_xy", sector={"spin_flip": 1})
    plain = Heisenberg(SQUARE, J1=1.0, J2=0.3)
    rotated = Heisenberg(SQUARE, J1=1.0, J2=0.3, sign_rule=True)
    energy = rayleigh_quotient(plain, model_vector(with_prior, hilbert))
    expected = rayleigh_quotient(rotated, model_vector(without, hilbert))
    assert energy == pytest.approx(expected, abs=1e-12)
    assert abs(energy - rayleigh_quotient(plain, model_vector(without, hilbert))) > 1e-3


def test_log_derivatives_do_not_see_the_fixed_sign():
    with_prior, without, hilbert = _pair(TRIANGULAR, "stripes_x", symmetrize="translations")
    x = torch.as_tensor(hilbert.all_states()[::7], dtype=torch.float64)
    assert torch.allclose(log_derivatives(with_prior, x), log_derivatives(without, x), atol=1e-12)


def test_a_float32_copy_carries_the_prior():
    with_prior, _, hilbert = _pair(TRIANGULAR, "stripes_y")
    copy32 = build_model(model_config(sign_prior="stripes_y"), TRIANGULAR, hilbert).float()
    copy32.load_state_dict(with_prior.state_dict())
    x = torch.as_tensor(hilbert.all_states(), dtype=torch.float64)
    with torch.no_grad():
        ratio = torch.exp(copy32(x.float()).to(torch.complex128) - with_prior(x))
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5)


def test_marks_must_close_around_the_torus():
    with pytest.raises(ValueError, match="axis 0, whose periodic extent 3 is odd"):
        sign_prior_sites(
            model_config(sign_prior="stripes_x"), Lattice((3, 2), kind="triangular"), SpinHalf(6, 0)
        )
    open_x = Lattice((3, 2), kind="triangular", pbc=(False, True))
    marks = sign_prior_sites(
        model_config(sign_prior="stripes_x", patch_size=1), open_x, SpinHalf(6, 0)
    )
    assert marks.tolist() == [False, True, False] * 2


def test_a_patch_shift_that_flips_the_sign_is_refused_with_an_odd_number_of_up_spins():
    """A kagome 2x2 has 12 sites (6 up): the shift by one cell flips (−1)^6 = +1, allowed;
    a triangular 2x3 chain of patches of one cell with 3 up spins is not."""
    kagome = Lattice((2, 2), kind="kagome")
    cfg = model_config(sign_prior="stripes_x", patch_size=1)
    assert sign_prior_sites(cfg, kagome, SpinHalf(12, 0)).sum() == 6
    with pytest.raises(ValueError, match="changes sign under a shift by one patch"):
        sign_prior_sites(cfg, Lattice((2, 3), kind="triangular"), SpinHalf(6, 0))
    free = model_config(sign_prior="stripes_x", patch_size=1, translation_invariant=False)
    assert sign_prior_sites(free, Lattice((2, 3), kind="triangular"), SpinHalf(6, 0)) is not None


def test_the_translation_invariant_network_stays_invariant_under_patch_shifts():
    """Patches of one cell: the shift by one cell swaps marked and unmarked columns, and
    with 8 up spins (−1)^(8 − n) = (−1)^n leaves the sign, and ψ, unchanged."""
    lattice = Lattice((4, 4), kind="triangular")
    with_prior, _, hilbert = _pair(lattice, "stripes_x", patch_size=1)
    row = np.flatnonzero((lattice.translation_shifts[:, :2] == (1, 0)).all(axis=1))[0]
    shift = lattice.translations[row]
    assert not np.array_equal(with_prior.sign_sites.numpy()[shift], with_prior.sign_sites.numpy())
    x = hilbert.random_states(64, torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(with_prior(x), with_prior(x[:, shift]), atol=1e-10)


@pytest.mark.parametrize(
    ("sections", "names"),
    [
        ({"model": {"sign_prior": "stripes_y"}}, ("model.sign_prior=stripes_y", "2-d lattice")),
        (
            {"model": {"sign_prior": "stripes_x", "positive": True}},
            ("model.sign_prior", "positive"),
        ),
        ({"model": {"sign_prior": "stripes"}}, ("model.sign_prior",)),
        (
            {
                "lattice": {"shape": [6, 3], "kind": "triangular"},
                "hamiltonian": {"sign_rule": False},
                "model": {"sign_prior": "stripes_y", "patch_size": [2, 1]},
            },
            ("model.sign_prior=stripes_y", "extent 3 is odd"),
        ),
    ],
)
def test_bad_sign_priors_are_one_line_errors(sections, names, tmp_path, capsys):
    data = tiny_heisenberg(tmp_path, **sections)
    code, _, err = run_main(capsys, "run", str(write_config(tmp_path / "c.yaml", data)), "--quiet")
    assert_one_line_error(code, err, *names)
