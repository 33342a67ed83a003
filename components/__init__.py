"""c2lip's stages, one module each (``python -m components.<stage> --params params/<stage>.yaml``), and
the libraries they use: :mod:`components.method`, :mod:`components.data`, :mod:`components.suite`,
:mod:`components.shared` (docs/architecture.md, "Layout")."""
