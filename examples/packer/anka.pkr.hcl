# An Anka VM template with metalift baked in; the build FAILS unless the guest
# can unlock (provision.sh). Syntax: the veertu-anka-vm-clone builder
# (veertuinc/packer-plugin-veertu-anka, examples/*.pkr.hcl and
# docs/builders/vm-clone.mdx): a clone of an existing template. The docs spell
# the source github.com/veertuinc/packer-plugin-veertu-anka; packer init wants
# it without the repository's packer-plugin- prefix.
#
#   packer init anka.pkr.hcl
#   packer build -var pkg_sha256=... -var team_id=TEAMID anka.pkr.hcl
packer {
  required_plugins {
    veertu-anka = {
      version = ">= 2.1.0"
      source  = "github.com/veertuinc/veertu-anka"
    }
  }
}

variable "source_vm_name" {
  type    = string
  default = "macos-15-base"
}

variable "vm_name" {
  type    = string
  default = "macos-15-metalift"
}

variable "pkg" {
  type    = string
  default = "metalift.pkg"
}

variable "pkg_sha256" {
  type = string
}

variable "team_id" {
  type = string
}

variable "policy" {
  type    = string
  default = "policy.toml"
}

variable "verify_profiles" {
  type    = string
  default = ""
}

variable "require_labels" {
  type    = string
  default = ""
}

variable "require_forward" {
  type    = bool
  default = false
}

variable "forward_unreachable_ok" {
  type    = bool
  default = false
}

source "veertu-anka-vm-clone" "metalift" {
  source_vm_name = var.source_vm_name
  vm_name        = var.vm_name
  vcpu_count     = 4
  ram_size       = "8G"
}

build {
  sources = ["source.veertu-anka-vm-clone.metalift"]

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
    # The anka user has passwordless sudo in Veertu's templates.
    execute_command = "chmod +x {{ .Path }}; sudo env {{ .Vars }} {{ .Path }}"
  }
}
