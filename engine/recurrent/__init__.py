"""The recurrent layers of hybrid models (Gated DeltaNet, short convolutions): their math over tensors and
the fixed-size state each keeps per sequence."""
