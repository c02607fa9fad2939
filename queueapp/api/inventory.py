"""The GPUs and the models they run, as the API shows them, and the
operator's setting of each model (staff)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from queueapp import rendering, selectors, services
from queueapp.api.auth import signed_in_member
from queueapp.api.documented import answers, retry_after_header
from queueapp.api.inputs import GpuSettingInput, ModelSettingInput
from queueapp.api.schema import GpuOutput, ModelOutput
from queueapp.api.views import ApiView, IsStaffMember


class GpuListView(ApiView):
    @extend_schema(
        parameters=[retry_after_header],
        responses=answers({200: GpuOutput(many=True)}),
        summary="The GPUs: health, loaded model, running job, models (URL for staff)",
    )
    def get(self, request: Request) -> Response:
        member = signed_in_member(request)
        running = selectors.running_jobs_by_gpu()
        parallel = selectors.model_parallels()
        return Response(
            [
                rendering.gpu_entry(
                    gpu,
                    running=running.get(gpu.pk, []),
                    parallel=parallel,
                    staff=member.is_staff,
                )
                for gpu in selectors.gpus_list()
            ]
        )


class GpuDetailView(ApiView):
    def get_permissions(self) -> Sequence[Any]:
        return [*super().get_permissions(), IsStaffMember()]

    @extend_schema(
        request=GpuSettingInput,
        parameters=[retry_after_header],
        responses=answers({200: GpuOutput}, 400, 403, 404, 415),
        summary="Enable or disable a GPU, or make it run one model at a time (staff)",
    )
    def patch(self, request: Request, name: str) -> Response:
        payload = GpuSettingInput(data=request.data)
        payload.is_valid(raise_exception=True)
        changed = services.gpu_settings_update(name=name, changes=payload.validated_data)
        gpu = next(gpu for gpu in selectors.gpus_list() if gpu.pk == changed.pk)
        return Response(
            rendering.gpu_entry(
                gpu,
                running=selectors.running_jobs_by_gpu().get(gpu.pk, []),
                parallel=selectors.model_parallels(),
                staff=True,
            )
        )


class ModelListView(ApiView):
    @extend_schema(
        parameters=[retry_after_header],
        responses=answers({200: ModelOutput(many=True)}),
        summary="The models the GPUs run, with how many jobs of each share a GPU",
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.models_list())


class ModelDetailView(ApiView):
    def get_permissions(self) -> Sequence[Any]:
        return [*super().get_permissions(), IsStaffMember()]

    @extend_schema(
        request=ModelSettingInput,
        parameters=[retry_after_header],
        responses=answers({200: ModelOutput}, 400, 403, 404, 415),
        summary="Set how many jobs of a model one GPU runs at once, what a front-door "
        "caller's hang-up does to its request, and its typical run (staff)",
    )
    def patch(self, request: Request, name: str) -> Response:
        payload = ModelSettingInput(data=request.data)
        payload.is_valid(raise_exception=True)
        setting = services.model_setting_update(name=name, changes=payload.validated_data)
        entry = next(model for model in selectors.models_list() if model["name"] == setting.name)
        return Response(entry)
