"""`gpushare dra-plugin` refuses to start on a checkpoint it cannot read, naming the file, and
leaves the file as it was (the claims in it are kubelet's; it will not prepare them again)."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from cli.main import app


def test_an_unreadable_checkpoint_stops_the_plugin_with_its_name_and_is_kept(tmp_path: Path) -> None:
    kubelet = tmp_path / "kubelet"
    plugin_dir = kubelet / "plugins" / "gpushare.k8s.io"
    plugin_dir.mkdir(parents=True)
    checkpoint = plugin_dir / "checkpoint.json"
    checkpoint.write_text("{not json")
    config = tmp_path / "config.yaml"
    cdi = tmp_path / "cdi"
    config.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "cdiSpecDirs": [str(cdi)],
                "kubelet": {"rootDir": str(kubelet)},
                "dra": {"enabled": True, "vendorKind": "example.com/gpu", "cdiRoot": str(cdi)},
            }
        )
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    res = CliRunner().invoke(
        app, ["dra-plugin", "--node", "n", "--config", str(config), "--kubeconfig", str(kubeconfig)]
    )
    assert res.exit_code == 1, res.output
    assert f"dra-plugin cannot start: {checkpoint}: not a checkpoint this plugin wrote" in res.output
    assert checkpoint.read_text() == "{not json"
    assert not (plugin_dir / "dra.sock").exists()
