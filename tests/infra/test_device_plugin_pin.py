"""The NVIDIA device plugin pin is current, with its source and date (issue 40, 2.5)."""

from infra import platform


def test_nvidia_device_plugin_is_the_current_release():
    """NVIDIA/k8s-device-plugin v0.20.0, tagged 2026-08-19, the newest release (CHANGELOG.md; read
    2026-12-06). Chart and plugin share the version (deployments/helm/nvidia-device-plugin/Chart.yaml:
    version "0.20.0", appVersion "0.20.0"); the chart's default affinity and the nodeSelector/tolerations
    values the stack sets are unchanged from the previous pin, 0.17.1 (values.yaml diff)."""
    chart = platform.NVIDIA_DEVICE_PLUGIN
    assert (chart.version, chart.app_version) == ("0.20.0", "0.20.0")
    assert chart.repo == "https://nvidia.github.io/k8s-device-plugin"
