"""The SWE domain's rubric set for rubric-based process reward (docs/algorithms.md section 5).

The paper's seven rubrics R1..R7 and their weights (they sum to 1). Plain data: the RPR functions
in `orchard_jax.rl` take a rubric set as a parameter (`rl.RubricSet(RUBRICS)`), and a judge's
scores are keyed by these names or by "R1".."R7".
"""

# (name, weight) in the paper's order R1..R7.
RUBRICS: tuple[tuple[str, float], ...] = (
    ("fix_quality", 0.15),
    ("reproduction", 0.18),
    ("coverage", 0.12),
    ("rigor", 0.15),
    ("discriminativeness", 0.14),
    ("regression_guard", 0.12),
    ("verification_integrity", 0.14),
)
RUBRIC_NAMES = tuple(name for name, _ in RUBRICS)
