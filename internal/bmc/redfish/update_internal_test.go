package redfish

import "testing"

// taskOutcome over every state a Task, a DMTF Job or a DellJob reports.
func TestTaskOutcome(t *testing.T) {
	dell := func(state string) taskDoc {
		var d taskDoc
		d.TaskState = "Running"
		d.Oem.Dell.JobState = state
		return d
	}
	tests := []struct {
		name string
		doc  taskDoc
		want string
	}{
		{"Completed OK", taskDoc{TaskState: "Completed", TaskStatus: "OK"}, taskDone},
		{"Completed Warning", taskDoc{TaskState: "Completed", TaskStatus: "Warning"}, taskDone},
		{"Completed, no status", taskDoc{TaskState: "Completed"}, taskDone},
		{"Completed Critical", taskDoc{TaskState: "Completed", TaskStatus: "Critical"}, taskFailed},
		{"Exception", taskDoc{TaskState: "Exception", TaskStatus: "Critical"}, taskFailed},
		{"Killed", taskDoc{TaskState: "Killed"}, taskFailed},
		{"Cancelled", taskDoc{TaskState: "Cancelled"}, taskFailed},
		{"Interrupted", taskDoc{TaskState: "Interrupted"}, taskFailed},
		{"New", taskDoc{TaskState: "New"}, taskRunning},
		{"Starting", taskDoc{TaskState: "Starting"}, taskRunning},
		{"Running", taskDoc{TaskState: "Running"}, taskRunning},
		{"Pending", taskDoc{TaskState: "Pending"}, taskRunning},
		{"Stopping", taskDoc{TaskState: "Stopping"}, taskRunning},
		{"Cancelling", taskDoc{TaskState: "Cancelling"}, taskRunning},
		{"Suspended", taskDoc{TaskState: "Suspended"}, taskRunning},
		{"Service", taskDoc{TaskState: "Service"}, taskRunning},
		{"Dell Scheduled", dell("Scheduled"), taskStaged},
		{"Dell Downloading", dell("Downloading"), taskRunning},
		{"Dell Failed", dell("Failed"), taskFailed},
		{"Dell CompletedWithErrors", dell("CompletedWithErrors"), taskFailed},
		{"DellJob Completed", taskDoc{JobState: "Completed"}, taskDone},
		{"DellJob Scheduled", taskDoc{JobState: "Scheduled"}, taskStaged},
		{"DMTF Job Completed Critical", taskDoc{JobState: "Completed", JobStatus: "Critical"}, taskFailed},
		{"DMTF Job Exception", taskDoc{JobState: "Exception"}, taskFailed},
		{"nothing", taskDoc{}, taskRunning},
	}
	for _, tt := range tests {
		if got := taskOutcome(tt.doc); got != tt.want {
			t.Errorf("%s: taskOutcome = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestTaskFallbacks(t *testing.T) {
	tests := []struct {
		st   updateStart
		want []string
	}{
		{updateStart{monitor: "/redfish/v1/TaskService/Tasks/JID_1"}, []string{"/redfish/v1/JobService/Jobs/JID_1"}},
		{updateStart{monitor: "/redfish/v1/TaskMonitors/7", task: "/redfish/v1/TaskService/Tasks/7"},
			[]string{"/redfish/v1/TaskService/Tasks/7", "/redfish/v1/JobService/Jobs/7"}},
		{updateStart{monitor: "/redfish/v1/TaskMonitors/7"}, nil},
		{updateStart{monitor: "/redfish/v1/TaskService/Tasks/7/Monitor"}, nil},
	}
	for _, tt := range tests {
		got := taskFallbacks(tt.st)
		if len(got) != len(tt.want) {
			t.Errorf("taskFallbacks(%+v) = %v, want %v", tt.st, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("taskFallbacks(%+v) = %v, want %v", tt.st, got, tt.want)
			}
		}
	}
}
