"""Framework layer tables in the mapping vocabulary (maxckpt.layouts.mapping), shared by the families that
load into the same framework model; a family with its own keeps its table in its file."""
