"""Config: defaults < TOML file < environment < flags, and validation by name."""

from __future__ import annotations

import pytest

from snowfence import config as cfg
from snowfence.cli import build_parser
from snowfence.errors import ConfigError


def test_defaults_are_the_contract():
    c = cfg.load(env={})
    assert c.bind == "tcp://127.0.0.1:5555"
    assert c.region == 0 and c.workers == 0 and c.worker_count >= 1
    assert c.embedded and c.etcd == ()
    assert (c.lease_ttl_s, c.keepalive_interval_s, c.fence_after_s, c.max_step_back_ms) == (10, 2.0, 5.0, 10)


def test_precedence_defaults_file_env_flags(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text('region = 1\nworkers = 3\nbind = "tcp://127.0.0.1:6000"\netcd = ["http://127.0.0.1:2379"]\n')
    env = {"SNOWFENCE_REGION": "2", "SNOWFENCE_WORKERS": "4"}
    c = cfg.load(flags={"region": "3"}, env=env, config_file=toml)
    assert c.region == 3  # flag beats env
    assert c.workers == 4  # env beats file
    assert c.bind == "tcp://127.0.0.1:6000"  # file beats default
    assert c.etcd == ("http://127.0.0.1:2379",)


def test_config_file_from_the_environment_and_a_snowfence_table(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text("[snowfence]\nregion = 4\n")
    assert cfg.load(env={"SNOWFENCE_CONFIG": str(toml)}).region == 4


def test_env_list_is_comma_separated():
    c = cfg.load(env={"SNOWFENCE_ETCD": "http://a:1, http://b:2"})
    assert c.etcd == ("http://a:1", "http://b:2")


@pytest.mark.parametrize(
    "flags, words",
    [
        ({"region": "8"}, "region must be 0..7"),
        ({"workers": "-1"}, "workers"),
        ({"workers": "abc"}, "not a valid int"),
        ({"sequence_bits": "13"}, "sum to 63"),
        ({"fence_after_s": "12"}, "fence_after_s < lease_ttl_s"),
        ({"keepalive_interval_s": "6"}, "keepalive_interval_s < fence_after_s"),
        ({"reservation_window_s": "1"}, "reservation_window_s"),
        ({"etcd": "localhost"}, "http://host:port"),
        ({"etcd_user": "u"}, "go together"),
        ({"log_format": "xml"}, "log_format"),
        ({"cluster": "a/b"}, "cluster"),
        ({"epoch": "soon"}, "ISO-8601"),
    ],
)
def test_invalid_settings_name_the_setting(flags, words):
    with pytest.raises(ConfigError) as info:
        cfg.load(flags=flags, env={})
    assert words in str(info.value)


def test_unknown_keys_in_the_file_are_refused(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text("regoin = 1\n")
    with pytest.raises(ConfigError, match="regoin"):
        cfg.load(env={}, config_file=toml)


def test_unreadable_or_invalid_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError):
        cfg.load(env={}, config_file=tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("region = = 1")
    with pytest.raises(ConfigError):
        cfg.load(env={}, config_file=bad)


def test_every_field_has_a_serve_flag_and_an_env_var():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = {opt for action in serve._actions for opt in action.option_strings}
    for name, field in cfg.FIELDS.items():
        assert cfg.flag_name(name) in flags
        assert field.metadata["help"]
        assert cfg.env_name(name) == "SNOWFENCE_" + name.upper()


def test_secrets_are_masked_in_public_view():
    c = cfg.load(flags={"etcd_user": "u", "etcd_password": "hunter2"}, env={})
    assert c.public()["etcd_password"] == "***"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("[::1]:9650", ("::1", 9650)),
        ("localhost:0", ("localhost", 0)),
        (":9464", ("", 9464)),
    ],
)
def test_metrics_bind_takes_a_host_and_a_port_ipv6_in_brackets(text, expected):
    assert cfg.host_port(text) == expected
    assert cfg.load(flags={"metrics_bind": text}, env={}).metrics_bind == text


@pytest.mark.parametrize(
    "text, words",
    [
        ("9650", "HOST:PORT"),
        ("[::1]", "HOST:PORT"),
        ("::1:9650", "brackets"),
        ("[::1:9650", "brackets"),
        ("[nohost]:9650", "IPv6"),
        ("127.0.0.1:99999", "port"),
        ("127.0.0.1:", "port"),
        ("127.0.0.1:x", "port"),
        ("127.0.0.1:٣", "port"),
    ],
)
def test_a_metrics_bind_without_a_usable_host_and_port_is_a_config_error(text, words, tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text(f'metrics_bind = "{text}"\n')
    for how in ({"flags": {"metrics_bind": text}, "env": {}}, {"env": {"SNOWFENCE_METRICS_BIND": text}},
                {"env": {}, "config_file": toml}):  # fmt: skip
        with pytest.raises(ConfigError) as info:
            cfg.load(**how)
        assert "metrics_bind" in str(info.value) and words in str(info.value), (how, str(info.value))
        assert text in str(info.value)


@pytest.mark.parametrize(
    "name, given, kept",
    [("log_level", "DEBUG", "debug"), ("log_level", "Warning", "warning"), ("log_format", "JSON", "json"),
     ("clock_policy", "HLC", "hlc")],
)  # fmt: skip
def test_word_settings_are_case_insensitive(name, given, kept):
    assert getattr(cfg.load(env={cfg.env_name(name): given}), name) == kept


def test_resolve_says_where_each_setting_came_from(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text("region = 1\nworkers = 3\n")
    env = {"SNOWFENCE_WORKERS": "4", "SNOWFENCE_CONFIG": str(toml), "SNOWFENCE_CLUSTER": "prod"}
    config, sources = cfg.resolve(flags={"cluster": "test"}, env=env)
    assert (config.region, config.workers, config.cluster) == (1, 4, "test")
    assert sources["region"] == ("file", str(toml))
    assert sources["workers"] == ("env", "SNOWFENCE_WORKERS")
    assert sources["cluster"] == ("flag", "--cluster")
    assert sources["bind"] == ("default", None)
    assert set(sources) == set(cfg.FIELDS)


def test_an_epoch_in_the_future_is_valid_config_serve_refuses_it_where_it_starts():
    # Workers re-validate the config under a clock that may have stepped since the broker started.
    from snowfence.broker import preflight

    config = cfg.load(flags={"epoch": "2030-01-01T00:00:00Z"}, env={})
    with pytest.raises(ConfigError, match="2030-01-01T00:00:00.000Z is in the future"):
        preflight.check_epoch(config)
    preflight.check_epoch(config, now_ms=config.layout.epoch_ms)  # from the epoch on, it is fine


def test_a_layout_near_or_past_its_end_is_valid_config_serve_refuses_it_where_it_starts():
    from snowfence.broker import preflight
    from snowfence.ids import MS_PER_YEAR

    # 36 time bits from 2026-01-01 end 2028-03-06T08:44:36.736Z: 2**36 ms after the epoch.
    config = cfg.load(flags={"time_bits": "36", "region_bits": "8"}, env={})
    end = config.layout.end_unix_ms
    assert end == config.layout.epoch_ms + 2**36 == config.layout.last_unix_ms + 1
    assert config.min_layout_years_left == 1.0
    preflight.check_layout_end(config, now_ms=end - MS_PER_YEAR)  # a year left: the default minimum
    assert config.layout.years_left(end - MS_PER_YEAR) == 1.0
    with pytest.raises(ConfigError) as refused:
        preflight.check_layout_end(config, now_ms=end - MS_PER_YEAR + 1)
    words = str(refused.value)
    assert "the layout ends at 2028-03-06T08:44:36.736Z, 1.00 years from now" in words, words
    assert "min_layout_years_left 1" in words and "more time_bits" in words and "\n" not in words
    # 0 refuses only a layout already past its end; the end itself is past it.
    off = cfg.load(flags={"time_bits": "36", "region_bits": "8", "min_layout_years_left": "0"}, env={})
    preflight.check_layout_end(off, now_ms=end - 1)
    for now_ms in (end, end + 10 * MS_PER_YEAR):
        with pytest.raises(ConfigError, match="the layout ended at 2028-03-06T08:44:36.736Z .36 time bits.: no ID"):
            preflight.check_layout_end(off, now_ms=now_ms)
    # The default layout has about 69 years left at its epoch.
    assert 69 < cfg.load(env={}).layout.years_left(config.layout.epoch_ms) < 70
    for bad in ("-1", "101", "nan"):
        with pytest.raises(ConfigError, match="min_layout_years_left"):
            cfg.load(flags={"min_layout_years_left": bad}, env={})


# -- etcd endpoints: one check (config.etcd_endpoint) for the settings and the etcd client ---------------


@pytest.mark.parametrize(
    "url, member",
    [
        ("http://127.0.0.1:2379", ("127.0.0.1", 2379, False)),
        ("https://etcd-1.example:2380", ("etcd-1.example", 2380, True)),
        # The settings refused these and the client took them: the scheme's case does not matter (RFC 3986).
        ("HTTP://h:2379", ("h", 2379, False)),
        ("Https://h:2379", ("h", 2379, True)),
        ("http://h:2379/", ("h", 2379, False)),  # one trailing slash, as etcdctl prints endpoints
        # An IPv6 address keeps its brackets: the client library joins host and port with a colon.
        ("http://[::1]:2379", ("[::1]", 2379, False)),
        ("http://[2001:DB8::1]:2379", ("[2001:db8::1]", 2379, False)),
    ],
)
def test_an_etcd_endpoint_names_host_port_and_tls(url, member):
    assert cfg.etcd_endpoint(url) == member
    assert cfg.load(flags={"etcd": url, "etcd_ca": "ca.pem"}, env={}).etcd == (url,)


@pytest.mark.parametrize(
    "url, words",
    [
        # The settings took these, and only the etcd client, in the worker, refused them.
        ("http://127.0.0.1:", "port"),
        ("http://:2379", "no host"),
        ("http://h:0", "port 0"),
        ("http://h:port", "port"),
        ("http://h:99999", "port"),
        ("http://h:٣", "port"),
        ("http://[::1:2379", "brackets"),
        ("http://::1:2379", "brackets"),
        # Both took these, and the client dropped what follows the host and port.
        ("http://user:secret@h:2379", "etcd_user and etcd_password"),
        ("http://h:2379/v3", "nothing may follow the port"),
        ("http://h:2379?x=1", "nothing may follow the port"),
        ("http://h:2379#f", "nothing may follow the port"),
        ("http://h:2379//", "nothing may follow the port"),
        # Python's URL parser drops a newline or a tab inside a URL without a word.
        ("http://h\n:2379", "spaces or control characters"),
        ("http://h\t:2379", "spaces or control characters"),
        ("http://h :2379", "spaces or control characters"),
        # Both refused these.
        ("https://h", "HOST:PORT"),
        ("grpc://h:2379", "http or https"),
        ("", "HOST:PORT"),
    ],
)
def test_an_unusable_etcd_endpoint_is_refused_by_the_settings_and_the_client_alike(url, words):
    for check in (
        lambda: cfg.etcd_endpoint(url),
        lambda: cfg.Config(etcd=(url,), etcd_ca="ca.pem"),
    ):
        with pytest.raises(ConfigError) as info:
            check()
        assert f"etcd endpoint {url!r} must look like http://host:port or https://host:port" in str(info.value)
        assert words in str(info.value), str(info.value)


def test_https_etcd_endpoints_without_a_ca_are_refused_with_the_settings():
    with pytest.raises(ConfigError, match="need etcd_ca"):
        cfg.load(flags={"etcd": "http://a:1,https://b:2"}, env={})
    with pytest.raises(ConfigError, match="must look like"):  # every endpoint is checked, not only up to one https
        cfg.load(flags={"etcd": "https://b:2,http://c"}, env={"SNOWFENCE_ETCD_CA": "ca.pem"})


@pytest.mark.parametrize("value", [-1, 4097])
def test_broker_mint_max_ids_outside_0_to_4096_is_refused_by_name(value):
    with pytest.raises(ConfigError, match="broker_mint_max_ids must be 0..4096"):
        cfg.Config(broker_mint_max_ids=value)


def test_the_broker_mints_small_requests_itself_unless_told_not_to():
    assert cfg.Config().broker_mint_max_ids == 64 and cfg.Config(broker_mint_max_ids=0).broker_mint_max_ids == 0
