# A Tart guest image with metalift baked in; the build FAILS unless the guest
# can unlock (provision.sh: checksum, team-pinned signature, install, policy,
# verify, `metalift doctor --bake`). Syntax: packer-plugin-tart's `tart-cli`
# source (cirruslabs/packer-plugin-tart, docs/builders/tart.mdx).
#
#   packer init tart.pkr.hcl
#   packer build -var pkg_sha256=$(awk '/metalift-.*\.pkg$/ { print $1 }' SHA256SUMS) \
#     -var team_id=TEAMID tart.pkr.hcl
packer {
  required_plugins {
    tart = {
      version = ">= 1.12.0"
      source  = "github.com/cirruslabs/tart"
    }
  }
}

variable "vm_base_name" {
  type    = string
  default = "ghcr.io/cirruslabs/macos-sequoia-base:latest"
}

variable "vm_name" {
  type    = string
  default = "macos-metalift"
}

variable "pkg" {
  type        = string
  default     = "metalift.pkg"
  description = "The release's .pkg, next to this template"
}

variable "pkg_sha256" {
  type        = string
  description = "The pkg's line in the release's SHA256SUMS"
}

variable "team_id" {
  type        = string
  description = "The Developer ID team that signed the pkg (10 characters)"
}

variable "policy" {
  type    = string
  default = "policy.toml"
}

variable "verify_profiles" {
  type        = string
  default     = ""
  description = "Space-separated require_verified profiles that must pass metalift verify"
}

variable "require_labels" {
  type        = string
  default     = ""
  description = "Space-separated [audit.labels] keys the policy must set (doctor --require-label)"
}

variable "require_forward" {
  type        = bool
  default     = false
  description = "[audit.forward] must be live and connected (doctor --require-forward)"
}

variable "forward_unreachable_ok" {
  type        = bool
  default     = false
  description = "With require_forward: the collector is unreachable from the build network"
}

source "tart-cli" "metalift" {
  vm_base_name = var.vm_base_name
  vm_name      = var.vm_name
  cpu_count    = 4
  memory_gb    = 8
  headless     = true
  ssh_username = "admin"
  ssh_password = "admin"
  ssh_timeout  = "180s"
}

build {
  sources = ["source.tart-cli.metalift"]

  provisioner "file" {
    source      = var.pkg
    destination = "/tmp/metalift.pkg"
  }

  provisioner "file" {
    source      = var.policy
    destination = "/tmp/50-bake.toml"
  }

  provisioner "shell" {
    script = "provision.sh"
    environment_vars = [
      "METALIFT_BAKE_PKG=/tmp/metalift.pkg",
      "METALIFT_BAKE_PKG_SHA256=${var.pkg_sha256}",
      "METALIFT_BAKE_TEAM_ID=${var.team_id}",
      "METALIFT_BAKE_POLICY=/tmp/50-bake.toml",
      "METALIFT_BAKE_VERIFY_PROFILES=${var.verify_profiles}",
      "METALIFT_BAKE_REQUIRE_LABELS=${var.require_labels}",
      "METALIFT_BAKE_REQUIRE_FORWARD=${var.require_forward ? "1" : "0"}",
      "METALIFT_BAKE_FORWARD_UNREACHABLE_OK=${var.forward_unreachable_ok ? "1" : "0"}",
    ]
    execute_command = "chmod +x {{ .Path }}; echo admin | sudo -S env {{ .Vars }} {{ .Path }}"
  }
}
