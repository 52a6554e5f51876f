"""`make fuzz`: the robustness campaign (fuzzing, and kills during writes)."""
