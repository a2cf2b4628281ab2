"""The idealized induction model (docs/science.md section 4) and checks of its two claims.

    from phaseinterp import theory
    model = theory.IdealizedInductionModel(6, 3, 2, heads=2, eps=0.0, kappa=0.1, gamma=4.0, beta=4.0)
    theory.global_search(model)                        # Theorem 1: the minimizer over slot distributions
    theory.gradient_flow(model, rho=0.01, seed=0)      # Theorem 2: log-linear gates under gradient flow
    theory.flow_seeds(model, range(20))                # ... from many random inits
"""

from phaseinterp.theory.flow import flow_seeds, gradient_descent, gradient_flow, integrate
from phaseinterp.theory.gates import gate_distributions, gate_loss, random_gate_parameters, slot_statistics
from phaseinterp.theory.model import (IdealizedInductionModel, LossEstimate, Population, check_equiangular,
                                      equiangular_embeddings, gram_deviation)
from phaseinterp.theory.results import FlowResult, FlowSweep, SearchGrid, SearchResult, chance_collision
from phaseinterp.theory.search import global_search, one_hot_losses, project_to_simplex, refine, search_grid

__all__ = ["FlowResult", "FlowSweep", "IdealizedInductionModel", "LossEstimate", "Population", "SearchGrid",
           "SearchResult", "chance_collision", "check_equiangular", "equiangular_embeddings", "flow_seeds",
           "gate_distributions", "gate_loss", "global_search", "gradient_descent", "gradient_flow", "gram_deviation",
           "integrate", "one_hot_losses", "project_to_simplex", "random_gate_parameters", "refine", "search_grid",
           "slot_statistics"]
