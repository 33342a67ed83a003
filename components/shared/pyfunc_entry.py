"""The registered model's code, as MLflow's models-from-code loads it: loading a version runs this file, which names
the model class (:class:`components.shared.pyfunc_model.OpenClipEmbedder`), instead of unpickling a
``python_model.pkl`` — a pickle runs whatever code it was made to run, this file only the project's own."""

from mlflow.models import set_model

from components.shared.pyfunc_model import OpenClipEmbedder

set_model(OpenClipEmbedder())
