"""``vime/Math-v0``: single-turn math with math-verify rewards and a graded arithmetic suite."""
